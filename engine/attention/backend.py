"""Attention over the paged KV cache. One kernel call per layer attends the whole step,
reading K/V in place through the block tables: on CUDA in Triton
(engine/attention/triton_kernel.py), on a CPU in C++ (engine/attention/cpu_kernel.py).

Where the CPU kernel could not be built, the torch path below:
- decodes of similar context length attended together: their blocks gathered once per layer
  into [kv_heads, batch, context, head_dim] and multiplied in the cache's dtype with the query
  heads of each KV head stacked (GQA without repeating K/V), softmax in fp32;
- a prefill slice that starts the sequence: SDPA's causal kernel;
- a later slice: its context blocks gathered, batched matmuls, a mask over only the columns of
  its own tokens (causal) and the tail of its last block, so no mask ever spans the context."""

import torch
import torch.nn.functional as F

from engine.attention.cpu_kernel import paged_attention_cpu
from engine.attention.metadata import DecodeGroup, ForwardBatch, PrefillSlice
from engine.kernels.cpu_build import cpu_kernel

NEG_INF = float("-inf")


class GatherBuffers:
    """Where decode groups gather their K/V blocks, kept across layers and steps: gathering
    into fresh memory pays for page faults, into these it runs about 4x faster here."""

    def __init__(self):
        self._buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        numel = 1
        for size in shape:
            numel *= size
        buffer = self._buffers.get(name)
        if buffer is None or buffer.numel() < numel or buffer.dtype != like.dtype or buffer.device != like.device:
            buffer = self._buffers[name] = torch.empty(numel, dtype=like.dtype, device=like.device)
        return buffer[:numel].view(shape)


def paged_attention(
    q: torch.Tensor,  # [T, heads, head_dim]
    k_cache: torch.Tensor,  # [kv_heads, slots, head_dim], this layer, the step's new K/V written (engine/model/layer_ops.py)
    v_cache: torch.Tensor,
    batch: ForwardBatch,
    buffers: GatherBuffers,
) -> torch.Tensor:
    kv_heads, slots, head_dim = k_cache.shape
    block_size = batch.block_size
    scale = head_dim**-0.5
    if q.is_cuda:
        from engine.attention.triton_kernel import paged_attention_triton  # imports triton: CUDA only

        return paged_attention_triton(q, k_cache.transpose(0, 1), v_cache.transpose(0, 1), batch.block_tables,
                                      batch.query_start, batch.seq_lens, block_size, scale)
    if cpu_kernel() is not None:
        return paged_attention_cpu(q, k_cache, v_cache, batch.block_tables, batch.query_start, batch.seq_lens, block_size, scale)
    k_blocks = k_cache.view(kv_heads, slots // block_size, block_size, head_dim)
    v_blocks = v_cache.view(kv_heads, slots // block_size, block_size, head_dim)
    out = torch.empty_like(q)
    for g in batch.decode_groups:
        out.index_copy_(0, g.rows, _decode_group(q, k_blocks, v_blocks, g, scale, buffers))
    for s in batch.prefills:
        rows = slice(s.start, s.start + s.length)
        if s.seq_len == s.length:  # the slice is the whole context so far
            new = batch.slot_mapping[rows]
            out[rows] = _first_slice(q[rows], k_cache[:, new], v_cache[:, new])
        else:
            out[rows] = _later_slice(q[rows], k_blocks, v_blocks, s, scale, buffers)
    return out


def _gather(blocks: torch.Tensor, ids: torch.Tensor, into: torch.Tensor) -> torch.Tensor:
    """blocks [kv_heads, num_blocks, block_size, head_dim] -> `into` [kv_heads, len(ids), block_size,
    head_dim]: one gather along the first dim per KV head (several times faster on a CPU than
    one along the second)."""
    for head in range(blocks.shape[0]):
        torch.index_select(blocks[head], 0, ids, out=into[head])
    return into


def _decode_group(q: torch.Tensor, k_blocks: torch.Tensor, v_blocks: torch.Tensor, g: DecodeGroup, scale: float,
                  buffers: GatherBuffers) -> torch.Tensor:
    """[B, heads, head_dim] for the group's single-token queries."""
    kv_heads, _, block_size, head_dim = k_blocks.shape
    size, context, heads = g.blocks.shape[0], g.blocks.shape[1] * block_size, q.shape[1]
    ids = g.blocks.reshape(-1)
    shape = (kv_heads, len(ids), block_size, head_dim)
    keys = _gather(k_blocks, ids, buffers.get("keys", shape, k_blocks)).view(kv_heads, size, context, head_dim)
    values = _gather(v_blocks, ids, buffers.get("values", shape, v_blocks)).view(kv_heads, size, context, head_dim)
    query = q.index_select(0, g.rows).view(size, kv_heads, heads // kv_heads, head_dim).transpose(0, 1)
    scores = torch.matmul(query, keys.transpose(-1, -2)).float().mul_(scale)  # [kv_heads, B, group, context]
    padding = torch.arange(context, device=q.device) >= g.seq_lens.unsqueeze(1)
    scores.masked_fill_(padding[None, :, None, :], NEG_INF)
    attended = torch.matmul(scores.softmax(-1).to(q.dtype), values)  # [kv_heads, B, group, head_dim]
    return attended.transpose(0, 1).reshape(size, heads, head_dim)


def _first_slice(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A slice that starts its sequence: causal attention over its own tokens (k, v: [kv_heads,
    n, head_dim], read back from the cache)."""
    attended = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), is_causal=True, enable_gqa=True
    )
    return attended.squeeze(0).transpose(0, 1)


def _later_slice(q: torch.Tensor, k_blocks: torch.Tensor, v_blocks: torch.Tensor, s: PrefillSlice, scale: float,
                 buffers: GatherBuffers) -> torch.Tensor:
    """A slice after cached context: all of the context visible, its own tokens causally."""
    kv_heads, _, _, head_dim = k_blocks.shape
    n, heads, first_new = s.length, q.shape[1], s.seq_len - s.length
    group = heads // kv_heads
    shape = (kv_heads, len(s.blocks), k_blocks.shape[2], head_dim)
    keys = _gather(k_blocks, s.blocks, buffers.get("keys", shape, k_blocks)).view(kv_heads, -1, head_dim)
    values = _gather(v_blocks, s.blocks, buffers.get("values", shape, v_blocks)).view(kv_heads, -1, head_dim)
    # the group's query heads folded into the rows: one matmul per KV head, K/V read once
    query = q.view(n, kv_heads, group, head_dim).permute(1, 2, 0, 3).reshape(kv_heads, group * n, head_dim)
    scores = torch.bmm(query, keys.transpose(1, 2)).float().mul_(scale).view(kv_heads, group, n, -1)
    future = torch.ones(n, n, dtype=torch.bool, device=q.device).triu_(1)
    scores[..., first_new : s.seq_len].masked_fill_(future, NEG_INF)
    scores[..., s.seq_len :] = NEG_INF
    probs = scores.softmax(-1).to(q.dtype).view(kv_heads, group * n, -1)
    attended = torch.bmm(probs, values).view(kv_heads, group, n, head_dim)
    return attended.permute(2, 0, 1, 3).reshape(n, heads, head_dim)
