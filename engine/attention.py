"""Attention over the paged KV cache (torch path: gather the context rows, then SDPA)."""

import torch
import torch.nn.functional as F

from engine.forward_batch import ForwardBatch


def paged_attention(
    q: torch.Tensor,  # [T, heads, head_dim]
    k: torch.Tensor,  # [T, kv_heads, head_dim]
    v: torch.Tensor,
    k_cache: torch.Tensor,  # [slots, kv_heads, head_dim], this layer
    v_cache: torch.Tensor,
    batch: ForwardBatch,
) -> torch.Tensor:
    k_cache.index_copy_(0, batch.slot_mapping, k)
    v_cache.index_copy_(0, batch.slot_mapping, v)
    out = torch.empty_like(q)
    for group in batch.decode_groups:
        query = q.index_select(0, group.rows).unsqueeze(2)  # [B, heads, 1, d]
        keys = _gather(k_cache, group.context_slots).transpose(1, 2)  # [B, kv_heads, L, d]
        values = _gather(v_cache, group.context_slots).transpose(1, 2)
        attended = F.scaled_dot_product_attention(query, keys, values, attn_mask=group.mask, enable_gqa=True)
        out.index_copy_(0, group.rows, attended.squeeze(2))
    for seg in batch.prefills:
        rows = slice(seg.start, seg.start + seg.length)
        query = q[rows].transpose(0, 1).unsqueeze(0)  # [1, heads, n, d]
        if seg.context_slots is None:
            keys, values = k[rows], v[rows]
        else:
            keys, values = _gather(k_cache, seg.context_slots), _gather(v_cache, seg.context_slots)
        keys = keys.transpose(0, 1).unsqueeze(0)
        values = values.transpose(0, 1).unsqueeze(0)
        attended = F.scaled_dot_product_attention(query, keys, values, attn_mask=seg.mask, is_causal=seg.mask is None, enable_gqa=True)
        out[rows] = attended.squeeze(0).transpose(0, 1)
    return out


def _gather(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Rows `slots` (any shape) of the cache; index_select is far faster than advanced indexing on CPU."""
    return cache.index_select(0, slots.reshape(-1)).view(*slots.shape, *cache.shape[1:])
