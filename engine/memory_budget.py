"""How many KV chunks fit beside the weights and one step's activations, checked at start."""

import torch

from engine.base.config import EngineConfig
from engine.base.model_config import ModelConfig
from engine.hardware import GIB, resolve_max_chunk_per_gpu
from engine.kv_cache import kv_bytes_per_token


def memory_budget_bytes(config: EngineConfig, device: torch.device) -> int:
    """What weights, activations and KV may use together on `device`."""
    if device.type == "cuda":
        _, total = torch.cuda.mem_get_info(device)
        return int(total * config.gpu_memory_utilization)
    return int(config.cpu_memory_budget_gib * GIB)


def activation_reserve_bytes(config: EngineConfig, model_config: ModelConfig, dtype: torch.dtype) -> int:
    # the widest intermediates of one step: the MLP's gate/up rows for the whole token budget,
    # the attention scores of one prefill slice against the longest context, and the logits.
    c = model_config
    mlp = config.max_num_batched_tokens * (3 * c.intermediate_size + 4 * c.hidden_size) * dtype.itemsize
    scores = config.max_num_batched_tokens * c.max_position_embeddings * c.num_heads * 4
    logits = config.max_num_seqs * c.vocab_size * 4
    return mlp + min(scores, GIB) + logits


def fit_max_chunk_per_gpu(
    config: EngineConfig, model_config: ModelConfig, device: torch.device, dtype: torch.dtype, weight_bytes: int
) -> int:
    """The max_chunk_per_gpu to run with (asked for, the node type's, or the largest that fits);
    raises EngineConfigError if it does not fit. `weight_bytes` includes the LoRA slots."""
    return resolve_max_chunk_per_gpu(
        config.max_chunk_per_gpu,
        config.node_type,
        memory_budget_bytes(config, device),
        weight_bytes,
        activation_reserve_bytes(config, model_config, dtype),
        config.chunk_size * kv_bytes_per_token(model_config, dtype),
    )
