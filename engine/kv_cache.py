"""The paged KV cache tensors: one flat row per token slot, per layer."""

import torch

from engine.model_config import ModelConfig


def kv_bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
    element = torch.tensor([], dtype=dtype).element_size()
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * element


class KVCache:
    def __init__(self, config: ModelConfig, num_slots: int, device, dtype: torch.dtype):
        shape = (config.num_layers, num_slots, config.num_kv_heads, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
