"""Engine settings (one engine = one GPU, or this machine's CPU)."""

from dataclasses import dataclass

from common.engine_settings import BY_NAME


def _default(name: str):
    """The engine's default for a compute setting, as declared once in common/engine_settings.py."""
    return BY_NAME[name].default


@dataclass(frozen=True)
class EngineConfig:
    backend: str = _default("backend")  # the engine behind the server: k25 or vllm (k25/commands/engine_backend.py)
    expert_parallel: bool = _default("expert_parallel")  # backend vllm only: experts spread over the ranks
    pipeline_parallel_size: int = _default("pipeline_parallel_size")  # backend vllm only: stages (one a node in a pool)
    chunk_size: int = 256
    max_chunk_per_gpu: int | str | None = None  # None: the node type's default (see engine.hardware.profiles); "auto": engine.hardware.chunk_choice
    expected_chunks_per_request: int = 1  # for max_chunk_per_gpu "auto": KV chunks a request holds (prompt + output)
    node_type: str = "cpu"
    block_size: int = 16  # tokens per KV block
    prefix_caching: bool = _default("prefix_caching")  # reuse the KV of full blocks whose prefix was computed before
    max_num_batched_tokens: int = _default("max_num_batched_tokens")  # the one token budget of a step, decodes and prefill chunks together
    max_num_seqs: int = _default("max_num_seqs")  # running sequences at once
    max_waiting: int = 1024  # queued requests beyond which new ones get RESOURCE_EXHAUSTED
    # a waiting request may be overtaken by ones with fewer prompt tokens left to compute for
    # this long (engine/core/admission_order.py); 0: first come, first served
    overtake_limit_s: float = _default("overtake_limit_s")  # k25 engine --overtake-limit-s
    kv_admission_limit: float = 0.92  # KV use above which new requests get RESOURCE_EXHAUSTED
    device: str = "cpu"
    dtype: str = "float32"
    quant: str | None = None  # weight widths per layer type (common/quant_spec.py); None: unquantised
    cpu_memory_budget_gib: float = 2.0  # what weights + KV may use when device is cpu
    gpu_memory_utilization: float = _default("gpu_memory_utilization")  # fraction of GPU memory weights + KV may use
    # KV tiers below the device (engine/kv_tiers/): host memory, then an optional local directory
    kv_host_tier_gib: float = _default("kv_host_tier_gib")  # 0: off
    kv_disk_tier_path: str | None = _default("kv_disk_tier_path")  # None: no disk tier
    kv_disk_tier_gib: float = _default("kv_disk_tier_gib")
    kv_tier_recency_weight: float = _default("kv_tier_recency_weight")  # eviction score (engine/core/tier_policy.py)
    kv_tier_decay_per_s: float = _default("kv_tier_decay_per_s")
    cuda_graphs: bool = _default("cuda_graphs")  # decode steps replay captured CUDA graphs (engine/runner/decode_graphs.py); no effect off CUDA
    # LoRA adapters (engine/lora/)
    max_loras: int = 0  # adapters on the device at once; 0 turns adapters off
    max_cpu_loras: int = 8  # adapters whose weights stay in CPU memory (at least max_loras)
    max_lora_rank: int = 64  # slots are this wide; adapters of higher rank are refused
    adapter_root: str | None = None  # adapters load only from folders under this one
    lora_kernel: str = "torch"  # "torch", or "triton" (CUDA, or TRITON_INTERPRET=1 on a CPU)
