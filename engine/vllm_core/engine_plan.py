"""What every process of a vLLM-backed engine decides before vLLM starts: the model folder vLLM
reads, the dtype, the KV blocks and vLLM's EngineArgs. The engine (core.py) and, on the other
nodes of a node group, vLLM's headless workers (headless.py) decide them by the same function
from the same `k25 engine` flags, so that every rank builds the same model."""

import dataclasses
from dataclasses import dataclass

from engine.base.config import EngineConfig
from engine.base.errors import EngineConfigError
from engine.kernels.cpu_build import cpu_flags
from engine.vllm_core.model_folder import vllm_model_folder
from engine.vllm_core.model_shape import read_shape
from engine.vllm_core.settings import BLOCK_SIZE, ONE_NODE, KVPlan, NodeGroup, engine_args, plan_kv, vllm_dtype


@dataclass(frozen=True)
class EnginePlan:
    config: EngineConfig  # as resolved: the dtype, vLLM's block size, the KV chunks
    folder: str
    kv: KVPlan
    max_model_len: int
    vocab_size: int
    kwargs: dict  # vLLM's EngineArgs
    env: dict[str, str]  # read by vLLM when it is imported

    def vllm_engine_args(self):
        """vLLM's EngineArgs of these keywords (imports vLLM)."""
        from vllm.config import KVEventsConfig, StructuredOutputsConfig
        from vllm.engine.arg_utils import EngineArgs

        kwargs = dict(self.kwargs)
        kwargs.update(structured_outputs_config=StructuredOutputsConfig(**kwargs["structured_outputs_config"]),
                      kv_events_config=KVEventsConfig(**kwargs["kv_events_config"]))
        return EngineArgs(**kwargs)


def plan_engine(config: EngineConfig, model: str, tensor_parallel_size: int = 1, eager: bool = False,
                group: NodeGroup = ONE_NODE) -> EnginePlan:
    """Raises EngineConfigError (or ModelLoadError) with a message for the user."""
    if config.quant:
        raise EngineConfigError("--quant is K25's engine's; backend vllm serves the checkpoint's own quantisation")
    folder = vllm_model_folder(model)
    shape = read_shape(folder)
    dtype = vllm_dtype(config.dtype, config.device, cpu_flags())
    kv = plan_kv(config, shape, dtype)
    max_model_len = min(shape.max_position_embeddings, kv.max_chunk_per_gpu * config.chunk_size)
    resolved = dataclasses.replace(config, dtype=dtype, block_size=BLOCK_SIZE, max_chunk_per_gpu=kv.max_chunk_per_gpu)
    # on a CPU, vLLM's KV memory is what holds exactly the planned blocks
    env = {} if config.device.startswith("cuda") else {"VLLM_CPU_KVCACHE_SPACE": str(kv.cpu_kv_gib)}
    kwargs = engine_args(resolved, folder, dtype, kv, max_model_len, tensor_parallel_size, eager, group)
    return EnginePlan(resolved, folder, kv, max_model_len, shape.vocab_size, kwargs, env)
