"""The paged KV cache tensors: one flat row per token slot, per layer."""

import torch

from engine.base.model_config import ModelConfig


def kv_bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * dtype.itemsize


class KVCache:
    """Per layer, K and V tensors of [slots, kv_heads, head_dim]; slot = block * block_size + offset."""

    def __init__(self, config: ModelConfig, num_slots: int, device, dtype: torch.dtype):
        # one allocation per layer: advanced indexing into a slice of one big tensor takes a slow path on CPU
        shape = (num_slots, config.num_kv_heads, config.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_layers)]
