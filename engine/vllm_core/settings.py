"""What K25's engine settings become for vLLM: pure functions of the settings and the model's
shape, so they are tested without vLLM installed.

KV capacity is exactly `max_chunk_per_gpu × chunk_size` tokens, as with K25's engine: vLLM
gets that many blocks (`num_gpu_blocks_override`) plus the one it keeps empty, and on a CPU
the KV memory that holds them (VLLM_CPU_KVCACHE_SPACE, in GiB)."""

import math
from dataclasses import dataclass

from common.engine_settings import VLLM_BLOCK_SIZE as BLOCK_SIZE  # tokens per KV block
from common.engine_settings import VLLM_MASTER_PORT as MASTER_PORT
from engine.base.config import EngineConfig
from engine.base.errors import EngineConfigError
from engine.core.sampling_params import SamplingParams
from engine.hardware.profiles import GIB, default_max_chunk_per_gpu, largest_max_chunk_per_gpu
from engine.vllm_core.model_shape import ModelShape

NULL_BLOCKS = 1  # vLLM keeps block 0 empty (the null block) besides the ones requests use
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class NodeGroup:
    """Where this process stands in one engine spread over several nodes, one process a node, by
    vLLM's multiprocessing executor (no Ray): rank 0 is the engine K25's wire and heartbeat reach,
    the other ranks run vLLM's headless workers; all meet at master_addr:master_port, rank 0's."""
    nodes: int = 1
    rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = MASTER_PORT

    def engine_kwargs(self) -> dict:
        if self.nodes == 1:
            return {}
        return {"nnodes": self.nodes, "node_rank": self.rank, "master_addr": self.master_addr,
                "master_port": self.master_port, "distributed_executor_backend": "mp"}


ONE_NODE = NodeGroup()


@dataclass(frozen=True)
class KVPlan:
    max_chunk_per_gpu: int
    blocks: int  # vLLM's num_gpu_blocks_override, its null block included
    cpu_kv_gib: int  # VLLM_CPU_KVCACHE_SPACE: whole GiB that hold those blocks (CPU only)


def vllm_dtype(requested: str, device: str, cpu_flags: set[str] | frozenset[str]) -> str:
    """`auto`: bfloat16 on CUDA and on a CPU with AVX512-BF16 or AMX (where vLLM's CPU kernels run
    it natively), else float32 (vLLM emulates bfloat16 there, several times slower)."""
    if requested != "auto":
        return requested
    if device.startswith("cuda") or {"avx512_bf16", "amx_bf16"} & cpu_flags:
        return "bfloat16"
    return "float32"


def omp_threads_bind(cpus: set[int], threads: int, ranks: int = 1) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for one engine on a CPU: its first `threads` CPUs (K25's
    --cpu-threads, at least one per tensor-parallel rank), split among its ranks ("0,1|2,3").
    vLLM's own choice keeps a core aside for a scheduler process that an in-process engine does
    not run."""
    mine = sorted(cpus)[: max(threads, ranks)]
    per_rank = max(1, len(mine) // ranks)
    return "|".join(",".join(map(str, mine[r * per_rank : (r + 1) * per_rank])) for r in range(ranks))


def kv_bytes_per_token(model: ModelShape, dtype: str) -> int:
    return 2 * model.num_layers * model.num_kv_heads * model.head_dim * DTYPE_BYTES[dtype]


def plan_kv(config: EngineConfig, model: ModelShape, dtype: str) -> KVPlan:
    """The KV blocks for `max_chunk_per_gpu` (asked for, else the node type's); on a CPU it must fit
    the memory budget beside the weights, or EngineConfigError names the largest that fits."""
    if config.chunk_size % BLOCK_SIZE:
        raise EngineConfigError(f"chunk_size {config.chunk_size} must be a multiple of {BLOCK_SIZE} with backend vllm")
    if config.max_chunk_per_gpu == "auto":
        raise EngineConfigError("max_chunk_per_gpu auto is K25's engine's; with backend vllm give a number")
    chunk_bytes = config.chunk_size * kv_bytes_per_token(model, dtype)
    wanted = config.max_chunk_per_gpu or default_max_chunk_per_gpu(config.node_type)
    if not config.device.startswith("cuda"):
        budget = int(config.cpu_memory_budget_gib * GIB)
        weight_bytes = model.num_parameters * DTYPE_BYTES[dtype]
        largest = largest_max_chunk_per_gpu(budget, weight_bytes, 0, chunk_bytes)
        wanted = wanted or largest
        if not 1 <= wanted <= largest:
            raise EngineConfigError(
                f"max_chunk_per_gpu={wanted} does not fit: weights {weight_bytes / GIB:.2f} GiB + KV "
                f"{wanted * chunk_bytes / GIB:.2f} GiB > budget {budget / GIB:.2f} GiB; the largest max_chunk_per_gpu "
                f"that fits is {largest}"
            )
    if not wanted:
        raise EngineConfigError(f"node type {config.node_type!r} has no default max_chunk_per_gpu; give one")
    blocks = wanted * config.chunk_size // BLOCK_SIZE + NULL_BLOCKS
    cpu_kv_gib = max(1, math.ceil(blocks * BLOCK_SIZE * kv_bytes_per_token(model, dtype) / GIB))
    return KVPlan(wanted, blocks, cpu_kv_gib)


def engine_args(config: EngineConfig, folder: str, dtype: str, plan: KVPlan, max_model_len: int,
                tensor_parallel_size: int = 1, eager: bool = False, group: NodeGroup = ONE_NODE) -> dict:
    """vLLM's EngineArgs, as keywords. Token ids come in and go out (the gateway tokenises, K25's
    output processor detokenises; vLLM's tokenizer serves its structured outputs only); the
    step's token budget, running sequences and prefix caching are K25's settings. Every rank of a
    node group builds the same ones but for its rank."""
    args = dict(
        model=folder, dtype=dtype, max_model_len=max_model_len, block_size=BLOCK_SIZE,
        num_gpu_blocks_override=plan.blocks, max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=max(config.max_num_batched_tokens, BLOCK_SIZE), enable_prefix_caching=config.prefix_caching,
        enable_chunked_prefill=True, tensor_parallel_size=tensor_parallel_size,
        pipeline_parallel_size=config.pipeline_parallel_size,
        enable_expert_parallel=config.expert_parallel, enforce_eager=eager,
        gpu_memory_utilization=config.gpu_memory_utilization, generation_config="vllm", disable_log_stats=True,
        structured_outputs_config={"backend": "guidance"},
        # evictions as events, which engine/vllm_core/kv_events.py collects in place of a publisher
        kv_events_config={"enable_kv_cache_events": config.prefix_caching, "publisher": "null"},
    )
    args.update(group.engine_kwargs())
    if config.max_loras:
        args.update(enable_lora=True, max_loras=config.max_loras, max_cpu_loras=max(config.max_cpu_loras, config.max_loras),
                    max_lora_rank=config.max_lora_rank)
    return args


STRUCTURED_KEYS = {"json_schema": "json", "regex": "regex", "lark": "grammar"}  # K25's constraint kinds -> vLLM's


def sampling_kwargs(params: SamplingParams, eos_token_ids) -> dict:
    """vLLM's SamplingParams for K25's, as keywords. vLLM stops on the end-of-sequence and stop ids
    it is given and never on its own (ignore_eos), and stop strings stay with K25's output
    processor, so both backends end an answer by the same rules. `structured` holds vLLM's
    StructuredOutputsParams keywords when the request is constrained (compiled by llguidance in
    both backends: engine_args picks vLLM's guidance backend)."""
    stops = tuple(params.stop_token_ids) + (() if params.ignore_eos else tuple(eos_token_ids))
    kwargs = dict(
        max_tokens=params.max_tokens, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
        seed=params.seed, stop_token_ids=sorted(set(stops)), ignore_eos=True, logprobs=params.logprobs,
        presence_penalty=params.presence_penalty, frequency_penalty=params.frequency_penalty,
        repetition_penalty=params.repetition_penalty, logit_bias=dict(params.logit_bias) or None, detokenize=False,
    )
    if params.constraint is not None:
        kwargs["structured"] = {STRUCTURED_KEYS[params.constraint.kind]: params.constraint.text}
    return kwargs
