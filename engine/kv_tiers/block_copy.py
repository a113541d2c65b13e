"""Copying whole KV blocks out of the paged cache and back, bit for bit.

A stored block is one tensor [layers, 2 (K, V), kv_heads, block_size, head_dim], so n blocks
gather into [n, layers, 2, kv_heads, block_size, head_dim] on the cache's device."""

import torch

from engine.attention.kv_cache import KVCache


def block_shape(kv: KVCache, block_size: int) -> tuple[int, ...]:
    heads, _, head_dim = kv.k[0].shape
    return (len(kv.k), 2, heads, block_size, head_dim)


def _rows(blocks: list[int], block_size: int, device) -> torch.Tensor:
    starts = torch.tensor(blocks, dtype=torch.int64, device=device)[:, None] * block_size
    return (starts + torch.arange(block_size, device=device)).flatten()


def gather_blocks(kv: KVCache, blocks: list[int], block_size: int) -> torch.Tensor:
    """A copy of `blocks`' KV, on the cache's device."""
    rows = _rows(blocks, block_size, kv.k[0].device)
    heads, _, head_dim = kv.k[0].shape
    n = len(blocks)

    def per_block(t: torch.Tensor) -> torch.Tensor:  # [heads, n * block_size, head_dim] -> [n, heads, block_size, head_dim]
        return t.index_select(1, rows).view(heads, n, block_size, head_dim).transpose(0, 1)

    return torch.stack([torch.stack([per_block(k), per_block(v)], 1) for k, v in zip(kv.k, kv.v)], 1)


def scatter_blocks(kv: KVCache, blocks: list[int], block_size: int, data: torch.Tensor) -> None:
    """Write `data` (as gather_blocks returns it, on the cache's device) into `blocks`."""
    rows = _rows(blocks, block_size, kv.k[0].device)
    heads, _, head_dim = kv.k[0].shape
    for layer, (k, v) in enumerate(zip(kv.k, kv.v)):
        for cache, which in ((k, 0), (v, 1)):
            cache.index_copy_(1, rows, data[:, layer, which].transpose(0, 1).reshape(heads, -1, head_dim))
