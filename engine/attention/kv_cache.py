"""The paged KV cache tensors: per layer, one row per token slot for each KV head."""

import torch

from engine.base.model_config import ModelConfig


def kv_bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * dtype.itemsize


class KVCache:
    """Per layer, K and V tensors of [kv_heads, slots, head_dim]; slot = block * block_size + offset.

    Heads first: the blocks a batch gathers then sit as [kv_heads, batch, context, head_dim],
    which batched matmuls read as they are, with no transposing copy of the gathered KV."""

    def __init__(self, config: ModelConfig, num_slots: int, device, dtype: torch.dtype):
        # one allocation per layer: advanced indexing into a slice of one big tensor takes a slow path on CPU
        shape = (config.num_kv_heads, num_slots, config.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_layers)]
