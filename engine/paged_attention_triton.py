"""Paged attention for a mixed varlen batch (prefill slices and decodes) in one Triton kernel
that reads K/V in place through the block tables: nothing is gathered, no mask is built.
The semantics are engine/paged_attention_reference.py's (its docstring says them).

Tiling. A program takes one tile of BLOCK_Q query rows of one sequence and one kv head, and
handles the GROUP query heads that share that kv head together: its BLOCK_M = BLOCK_Q *
GROUP_PAD rows are (query row, head of the group) pairs, so each K/V tile is loaded once for
the whole group, and a decode (one query row) still fills GROUP_PAD rows of the tl.dot.
GROUP_PAD is GROUP rounded up to a power of two; the extra rows are masked off. It walks the
keys 0..(last position of its tile) in tiles of TILE_N positions, looking up each position's
block id in the sequence's block-table row (so a tile may start mid-block and span blocks),
with a flash-style online softmax in float32: running max and sum per row, accumulator
rescaled by exp2(old max - new max). Causality: a key is masked (score -inf) when its
position is past the row's own position, seq_lens[s] - n_s + i; the first key tile always
holds position 0, visible to every row, so the running max is finite from the first tile on.

Grid (T // BLOCK_Q + S, num_kv_heads), known on the host without reading device values (no
sync; fixed for fixed T and S): sequence s owns program ids from query_start[s] // BLOCK_Q + s
on, which is at least ceil(n_s / BLOCK_Q) ids, and each program finds its sequence by a binary
search over query_start (as vLLM's unified attention does); an id past its sequence's last
tile returns at once (at most one per sequence).

Precision: q.k and p.v go through tl.dot with float32 accumulation ("ieee" for float32 inputs,
so no TF32); for 16-bit inputs the probabilities are rounded to V's dtype before p.v, as in
FlashAttention. Output cast to q's dtype. Rows of the output owned by no sequence (from
query_start[-1] on) are left unwritten.

Reductions use tl.reduce with triton.language.standard's combine functions rather than
tl.max / tl.sum: those are @jit helpers that the interpreter can run only if TRITON_INTERPRET=1
was set before anything imported triton, while tl.reduce is patched by the interpreter itself
(it recognises these combine functions and reduces with numpy). On a CPU the kernel runs only
under TRITON_INTERPRET=1, set before this module is first imported; the interpreter's bfloat16
tl.dot returns garbage (triton 3.9), so bfloat16 is refused there."""

import math
import os

import torch
import triton
import triton.language as tl

from engine.paged_attention_reference import check_paged_attention_args

TILE_N = 32  # key positions per inner iteration
BLOCK_M_PREFILL = 64  # (query row, head) pairs per program when some sequence has several query rows
BLOCK_M_DECODE = 16  # ... when every sequence has exactly one (tl.dot needs at least 16)
HEAD_DIMS = tuple(2**i for i in range(4, 9))  # 16 .. 256: powers of two (tl.arange), at least 16 (tl.dot)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _sequence_of(query_start_ptr, num_seqs, tile, BLOCK_Q: tl.constexpr):
    """The last sequence s whose first program id, query_start[s] // BLOCK_Q + s, is <= tile (-1 if none)."""
    lo: tl.int32 = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(query_start_ptr + mid) // BLOCK_Q + mid <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _paged_attention_kernel(
    out_ptr, q_ptr, k_ptr, v_ptr, block_tables_ptr, query_start_ptr, seq_lens_ptr,
    num_seqs, qk_scale,
    stride_qt, stride_qh, stride_qd, stride_ot, stride_oh, stride_od,
    stride_ks, stride_kh, stride_kd, stride_vs, stride_vh, stride_vd, stride_bt,
    BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, TILE_N: tl.constexpr, PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = _sequence_of(query_start_ptr, num_seqs, tile, BLOCK_Q)
    if seq < 0:
        return
    q_begin = tl.load(query_start_ptr + seq)
    n = tl.load(query_start_ptr + seq + 1) - q_begin
    q0 = (tile - (q_begin // BLOCK_Q + seq)) * BLOCK_Q  # this tile's first query row within the sequence
    if q0 >= n:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    first_pos = seq_len - n  # position of the sequence's query row 0

    r = tl.arange(0, BLOCK_M)
    row = q0 + r // GROUP_PAD
    head = kv_head * GROUP + r % GROUP_PAD
    row_mask = (row < n) & (r % GROUP_PAD < GROUP)
    q_pos = first_pos + row
    d = tl.arange(0, HEAD_DIM)
    token = (q_begin + row).to(tl.int64)
    q = tl.load(
        q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :] * stride_qd,
        mask=row_mask[:, None], other=0.0,
    )

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, HEAD_DIM], 0.0, tl.float32)
    # keys up to the tile's last position: first_pos + min(q0 + BLOCK_Q, n) - 1
    kv_end = tl.minimum(first_pos + q0 + BLOCK_Q, seq_len)
    table_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    k_base = k_ptr + kv_head * stride_kh
    v_base = v_ptr + kv_head * stride_vh
    cols = tl.arange(0, TILE_N)
    for start in range(0, kv_end, TILE_N):
        k_pos = start + cols
        k_mask = k_pos < kv_end
        block = tl.load(table_row + k_pos // BLOCK_SIZE, mask=k_mask, other=0)
        slot = block.to(tl.int64) * BLOCK_SIZE + k_pos % BLOCK_SIZE
        k_t = tl.load(k_base + slot[None, :] * stride_ks + d[:, None] * stride_kd, mask=k_mask[None, :], other=0.0)
        scores = tl.dot(q, k_t, input_precision=PRECISION) * qk_scale  # log2 units
        visible = k_mask[None, :] & (k_pos[None, :] <= q_pos[:, None])
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.reduce(scores, 1, tl.standard._elementwise_max))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine)
        v = tl.load(v_base + slot[:, None] * stride_vs + d[None, :] * stride_vd, mask=k_mask[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    out = acc / l_i[:, None]
    tl.store(
        out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :] * stride_od,
        out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None],
    )


def _interpreted() -> bool:
    """Whether the kernel can run on a CPU: the interpreter was on when it was decorated, and is on now."""
    return os.environ.get("TRITON_INTERPRET") == "1" and type(_paged_attention_kernel).__name__ == "InterpretedFunction"


def paged_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    scale: float,
) -> torch.Tensor:
    """q [T, num_heads, head_dim], k_cache and v_cache [num_slots, num_kv_heads, head_dim] (one
    layer), block_tables [S, max_blocks], query_start [S + 1] and seq_lens [S] int32 ->
    [T, num_heads, head_dim] in q's dtype. Shapes, dtypes and devices are checked here (ValueError);
    the values in query_start, seq_lens and block_tables are not (that would need a sync): they
    must satisfy 0 < n_s <= seq_lens[s] and name blocks inside the cache."""
    check_paged_attention_args(q, k_cache, v_cache, block_tables, query_start, seq_lens, block_size)
    head_dim = q.shape[2]
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim {head_dim} is not supported: the kernel needs a power of two in {HEAD_DIMS}")
    if q.dtype not in DTYPES or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(
            f"q, k_cache and v_cache must share one dtype of {DTYPES}; got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}"
        )
    for name, t in (("block_tables", block_tables), ("query_start", query_start), ("seq_lens", seq_lens)):
        if t.dtype != torch.int32:
            raise ValueError(f"{name} must be int32; got {t.dtype}")
    tensors = (q, k_cache, v_cache, block_tables, query_start, seq_lens)
    if len({t.device for t in tensors}) != 1:
        raise ValueError(f"all tensors must be on one device; got {[str(t.device) for t in tensors]}")
    if q.device.type != "cuda":
        if not _interpreted():
            raise ValueError(
                f"the Triton paged-attention kernel runs on CUDA; on {q.device} only under TRITON_INTERPRET=1, "
                "set before engine.paged_attention_triton is first imported (use paged_attention_reference instead)"
            )
        if q.dtype == torch.bfloat16:
            raise ValueError("the Triton interpreter multiplies bfloat16 wrongly (triton 3.9); run bfloat16 on CUDA")
    if query_start.stride(0) != 1 or seq_lens.stride(0) != 1 or block_tables.stride(1) != 1:
        raise ValueError("query_start, seq_lens and the rows of block_tables must be contiguous")

    out = torch.empty_like(q)
    tokens, num_heads = q.shape[0], q.shape[1]
    num_seqs, num_kv_heads = block_tables.shape[0], k_cache.shape[1]
    if tokens == 0 or num_seqs == 0:
        return out
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    block_m = max(BLOCK_M_DECODE if tokens <= num_seqs else BLOCK_M_PREFILL, group_pad)
    block_q = block_m // group_pad
    grid = (tokens // block_q + num_seqs, num_kv_heads)
    _paged_attention_kernel[grid](
        out, q, k_cache, v_cache, block_tables, query_start, seq_lens,
        num_seqs, scale * math.log2(math.e),
        q.stride(0), q.stride(1), q.stride(2), out.stride(0), out.stride(1), out.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0),
        BLOCK_SIZE=block_size, GROUP=group, GROUP_PAD=group_pad, BLOCK_Q=block_q, BLOCK_M=block_m,
        HEAD_DIM=head_dim, TILE_N=TILE_N, PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    return out
