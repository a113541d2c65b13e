"""Paged attention for a mixed varlen batch (prefill slices and decodes) in one Triton kernel
that reads K/V in place through the block tables: nothing is gathered, no mask is built.
The semantics are engine/attention/torch_reference.py's (its docstring says them).

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

Grid (T // BLOCK_Q + S, num_kv_heads, segments), known on the host without reading device
values (no sync; fixed for fixed T and S): sequence s owns program ids from query_start[s] //
BLOCK_Q + s on, which is at least ceil(n_s / BLOCK_Q) ids, and each program finds its sequence
by a binary search over query_start (as vLLM's unified attention does); an id past its
sequence's last tile returns at once (at most one per sequence).

Split keys (flash-decoding). A decode at batch 1 is num_kv_heads programs, each walking its
whole context alone: a handful of a GPU's ~100 SMs busy, for the longest contexts most of all.
When the grid has fewer programs than the device has SMs (`segments_for`), each tile's keys
are cut into `segments` runs of whole key tiles, one program each, which store their
unnormalised p.v with their running max and sum; `_merge_segments` rescales the runs to one
max and divides once. A row sees a prefix of a run's keys; one that sees none stores max -inf
and sum 0 (the rescale guards against -inf - -inf on its way), and every row sees key 0, in
run 0, so the merged max is finite.

Launch shapes (`launch_meta`): a program takes BLOCK_M (query row, head) pairs against TILE_N
keys at a time (32; 16 at head_dim 256). 16-bit inputs multiply on the tensor cores: 16 rows
for decodes (4 warps), 64 for prefill (32 at head_dim 256; 8 warps). Float32 (no TF32)
multiplies with FMAs whose operands all sit in registers: 16 rows, 8 warps. Chosen from sweeps
compiled for sm_80 and sm_90 (registers and spills read from the cubins) over head dims 16-256
and GQA groups 1-16, as shapes that keep their tiles in registers (a few values parked on the
stack at most: 24 bytes a thread); tests/engine/kernels/test_triton_compiles.py compiles them again.

Precision: q.k and p.v go through tl.dot with float32 accumulation ("ieee" for float32 inputs,
so no TF32); for 16-bit inputs the probabilities are rounded to V's dtype before p.v, as in
FlashAttention. Output cast to q's dtype. Rows of the output owned by no sequence (from
query_start[-1] on) hold no defined value.

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

from engine.attention.torch_reference import check_paged_attention_args

MAX_SEGMENTS = 16  # key runs a tile's keys are split into at most (split keys, above)
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
    out_ptr, part_ptr, part_max_ptr, part_sum_ptr, q_ptr, k_ptr, v_ptr, block_tables_ptr, query_start_ptr, seq_lens_ptr,
    num_seqs, num_heads, qk_scale,
    stride_qt, stride_qh, stride_qd, stride_ot, stride_oh, stride_od,
    stride_ks, stride_kh, stride_kd, stride_vs, stride_vh, stride_vd, stride_bt,
    BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, TILE_N: tl.constexpr, PRECISION: tl.constexpr,
    SEGMENTED: tl.constexpr,
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
    kv_begin = 0
    if SEGMENTED:  # this program's run of whole key tiles
        segment = tl.program_id(2)
        segments = tl.num_programs(2)
        run = ((kv_end + TILE_N - 1) // TILE_N + segments - 1) // segments * TILE_N
        kv_begin = segment * run
        kv_end = tl.minimum(kv_begin + run, kv_end)
    table_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    k_base = k_ptr + kv_head * stride_kh
    v_base = v_ptr + kv_head * stride_vh
    cols = tl.arange(0, TILE_N)
    for start in range(kv_begin, kv_end, TILE_N):
        k_pos = start + cols
        k_mask = k_pos < kv_end
        block = tl.load(table_row + k_pos // BLOCK_SIZE, mask=k_mask, other=0)
        slot = block.to(tl.int64) * BLOCK_SIZE + k_pos % BLOCK_SIZE
        k_t = tl.load(k_base + slot[None, :] * stride_ks + d[:, None] * stride_kd, mask=k_mask[None, :], other=0.0)
        scores = tl.dot(q, k_t, input_precision=PRECISION) * qk_scale  # log2 units
        visible = k_mask[None, :] & (k_pos[None, :] <= q_pos[:, None])
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.reduce(scores, 1, tl.standard._elementwise_max))
        if SEGMENTED:  # a row may see none of a run's first keys: its max stays -inf, and -inf - -inf is NaN
            m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine)
        v = tl.load(v_base + slot[:, None] * stride_vs + d[None, :] * stride_vd, mask=k_mask[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    if SEGMENTED:  # [T, num_heads, segments] (and head_dim), merged by _merge_segments
        part = (token * num_heads + head) * tl.num_programs(2) + tl.program_id(2)
        tl.store(part_ptr + part[:, None] * HEAD_DIM + d[None, :], acc, mask=row_mask[:, None])
        tl.store(part_max_ptr + part, tl.where(l_i > 0, m_i, float("-inf")), mask=row_mask)  # no key: the guard's 0
        tl.store(part_sum_ptr + part, l_i, mask=row_mask)
    else:
        out = acc / l_i[:, None]
        tl.store(
            out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :] * stride_od,
            out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None],
        )


def launch_meta(dtype: torch.dtype, head_dim: int, group: int, block_size: int, decodes_only: bool) -> dict:
    """The kernel's constexprs but SEGMENTED, and num_warps, for these inputs (launch shapes, above)."""
    group_pad = triton.next_power_of_2(group)
    tile_n = 16 if head_dim > 128 else 32
    if dtype == torch.float32:
        block_m, num_warps = 16, 8
    elif decodes_only:
        block_m, num_warps = 16, 4
    else:
        block_m, num_warps = 64 if head_dim <= 128 else 32, 8
    block_m = max(block_m, group_pad)
    return dict(
        BLOCK_SIZE=block_size, GROUP=group, GROUP_PAD=group_pad, BLOCK_Q=block_m // group_pad, BLOCK_M=block_m,
        HEAD_DIM=head_dim, TILE_N=tile_n, PRECISION="ieee" if dtype == torch.float32 else "tf32", num_warps=num_warps,
    )


def segments_for(programs: int, sms: int) -> int:
    """Key runs per tile for a grid of `programs` (query tiles x KV heads): enough to give each
    of the device's `sms` SMs a program, at most MAX_SEGMENTS."""
    return max(1, min(MAX_SEGMENTS, sms // programs))


def _merge_segments(part: torch.Tensor, part_max: torch.Tensor, part_sum: torch.Tensor, out: torch.Tensor) -> None:
    """out [T, H, D] <- the runs' p.v [T, H, S, D] over their sums [T, H, S], each rescaled from
    its own max [T, H, S] (log2 units) to the row's."""
    weight = torch.exp2(part_max - part_max.amax(-1, keepdim=True))
    total = (part_sum * weight).sum(-1, keepdim=True)
    out.copy_((part * weight.unsqueeze(-1)).sum(-2) / total)


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
    segments: int | None = None,
) -> torch.Tensor:
    """q [T, num_heads, head_dim], k_cache and v_cache [num_slots, num_kv_heads, head_dim] (one
    layer), block_tables [S, max_blocks], query_start [S + 1] and seq_lens [S] int32 ->
    [T, num_heads, head_dim] in q's dtype. `segments`: key runs per tile (split keys, above);
    None: `segments_for` the grid. Shapes, dtypes and devices are checked here (ValueError);
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
                "set before engine.attention.triton_kernel is first imported (use engine.attention.torch_reference instead)"
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
    meta = launch_meta(q.dtype, head_dim, num_heads // num_kv_heads, block_size, tokens <= num_seqs)
    tiles = tokens // meta["BLOCK_Q"] + num_seqs
    if segments is None:  # the interpreter: one key run, unless asked for more
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 1
        segments = segments_for(tiles * num_kv_heads, sms)
    if segments < 1:
        raise ValueError(f"segments must be at least 1; got {segments}")
    parts = [torch.empty(tokens, num_heads, segments, *tail, device=q.device, dtype=torch.float32)
             for tail in ((head_dim,), (), ())] if segments > 1 else [out] * 3
    _paged_attention_kernel[(tiles, num_kv_heads, segments)](
        out, *parts, q, k_cache, v_cache, block_tables, query_start, seq_lens,
        num_seqs, num_heads, scale * math.log2(math.e),
        q.stride(0), q.stride(1), q.stride(2), out.stride(0), out.stride(1), out.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0),
        SEGMENTED=segments > 1, **meta,
    )
    if segments > 1:
        _merge_segments(*parts, out)
    return out
