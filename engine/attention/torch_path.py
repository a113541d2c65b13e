"""The torch attention path, for a CPU where the C++ kernel could not be built:
- decodes of similar context length attended together: their blocks gathered once per layer
  into [kv_heads, batch, context, head_dim] and multiplied in the cache's dtype with the query
  heads of each KV head stacked (GQA without repeating K/V), softmax in fp32;
- a prefill slice that starts the sequence: SDPA's causal kernel;
- a later slice: its context blocks gathered, batched matmuls, a mask over only the columns of
  its own tokens (causal) and the tail of its last block, so no mask ever spans the context.

Its plan (TorchPlan: the slices and the decode groups) is built from the step's varlen layout
once per step, on the first layer, and read by every other layer."""

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from engine.attention.metadata import ForwardBatch

NEG_INF = float("-inf")
# A decode group's shortest context is at least this fraction of its longest: padding every
# query to the longest context of the whole batch would gather and attend to up to 40x more
# KV than needed when contexts range from 32 to 1,280 tokens.
GROUP_LENGTH_RATIO = 0.75


@dataclass
class PrefillSlice:
    start: int  # first query row
    length: int  # query tokens in this slice
    seq_len: int  # context after this step: positions [seq_len - length, seq_len) are the slice's
    blocks: torch.Tensor  # [blocks covering seq_len] block ids


@dataclass
class DecodeGroup:
    """Single-token queries of similar context length, attended together."""

    rows: torch.Tensor  # [B] query rows
    blocks: torch.Tensor  # [B, nb] block ids, nb covering the longest context (short rows padded with block 0)
    seq_lens: torch.Tensor  # [B] context length of each


@dataclass
class TorchPlan:
    prefills: list[PrefillSlice]  # more than one query row each, one by one
    decode_groups: list[DecodeGroup]  # the single-token queries in groups of similar context length


def torch_plan(batch: ForwardBatch) -> TorchPlan:
    starts, seq_lens, tables = batch.query_start.numpy(), batch.seq_lens.numpy(), batch.block_tables.numpy()
    block_size = batch.block_size
    prefills = [
        PrefillSlice(int(starts[i]), int(starts[i + 1] - starts[i]), int(seq_lens[i]),
                     torch.from_numpy(tables[i, : -(-seq_lens[i] // block_size)].astype(np.int64)))
        for i in np.flatnonzero(np.diff(starts) > 1)
    ]
    groups = [
        DecodeGroup(torch.from_numpy(starts[g].astype(np.int64)),
                    torch.from_numpy(tables[g, : -(-seq_lens[g].max() // block_size)].astype(np.int64)),
                    torch.from_numpy(seq_lens[g]))
        for g in _similar_lengths(np.flatnonzero(np.diff(starts) == 1), seq_lens)
    ]
    return TorchPlan(prefills, groups)


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


class TorchAttention:
    name = "torch"

    def __init__(self):
        self.buffers = GatherBuffers()
        self._planned: tuple[ForwardBatch, TorchPlan] | None = None  # the step's plan, built on its first layer

    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: ForwardBatch,
                scale: float) -> torch.Tensor:
        if self._planned is None or self._planned[0] is not batch:
            self._planned = (batch, torch_plan(batch))
        plan = self._planned[1]
        kv_heads, slots, head_dim = k_cache.shape
        block_size = batch.block_size
        k_blocks = k_cache.view(kv_heads, slots // block_size, block_size, head_dim)
        v_blocks = v_cache.view(kv_heads, slots // block_size, block_size, head_dim)
        out = torch.empty_like(q)
        for g in plan.decode_groups:
            out.index_copy_(0, g.rows, _decode_group(q, k_blocks, v_blocks, g, scale, self.buffers))
        for s in plan.prefills:
            rows = slice(s.start, s.start + s.length)
            if s.seq_len == s.length:  # the slice is the whole context so far
                new = batch.slot_mapping[rows]
                out[rows] = _first_slice(q[rows], k_cache[:, new], v_cache[:, new])
            else:
                out[rows] = _later_slice(q[rows], k_blocks, v_blocks, s, scale, self.buffers)
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


def _similar_lengths(indices: np.ndarray, seq_lens: np.ndarray) -> list[np.ndarray]:
    """`indices` cut into groups, longest context first, each group's shortest at least
    GROUP_LENGTH_RATIO of its longest."""
    ordered = indices[np.argsort(-seq_lens[indices], kind="stable")]
    groups, first = [], 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or seq_lens[ordered[i]] < GROUP_LENGTH_RATIO * seq_lens[ordered[first]]:
            groups.append(ordered[first:i])
            first = i
    return groups
