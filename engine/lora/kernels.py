"""LoRA shrink and expand for a step whose tokens use different adapters (segmented, as in
punica's SGMV): the tokens of one adapter are cut into blocks of up to KERNEL_BLOCK_ROWS rows
and each program multiplies one block by its adapter's matrices with tl.dot.

shrink: s[rows, i, :] = x[rows] @ A[slot, i].T          for every output slice i
expand: y[rows, slice i] += s[rows, i, :] @ B[slot, slice i].T
Base-model tokens belong to no block and are never touched. Accumulation is in fp32; fp32
inputs are multiplied exactly (no TF32). Only tl builtins are used, not the @jit helpers of
triton.language.standard (tl.sum, tl.zeros): those run under TRITON_INTERPRET=1 only if it
was set before anything imported triton, and peft imports it."""

import torch
import triton
import triton.language as tl

from engine.lora.batch import KERNEL_BLOCK_ROWS, LoRABatch

BLOCK_K = 32  # input features per shrink iteration


@triton.jit
def _block(rows_ptr, block_slot_ptr, block_start_ptr, block_rows_ptr, BLOCK_M: tl.constexpr):
    """This program's block (axis 0 of the grid): its adapter slot, token rows and which rows are real."""
    block = tl.program_id(0)
    m = tl.arange(0, BLOCK_M)
    m_mask = m < tl.load(block_rows_ptr + block)
    rows = tl.load(rows_ptr + tl.load(block_start_ptr + block) + m, mask=m_mask, other=0)
    return tl.load(block_slot_ptr + block), rows, m_mask


@triton.jit
def _shrink_kernel(
    x_ptr, a_ptr, s_ptr, rows_ptr, block_slot_ptr, block_start_ptr, block_rows_ptr,
    in_features, rank,
    stride_x, stride_a_slot, stride_a_slice, stride_a_rank, stride_s_token, stride_s_slice,
    BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):
    slice_index = tl.program_id(1)
    slot, rows, m_mask = _block(rows_ptr, block_slot_ptr, block_start_ptr, block_rows_ptr, BLOCK_M)
    r = tl.arange(0, BLOCK_R)
    r_mask = r < rank
    a_base = a_ptr + slot * stride_a_slot + slice_index * stride_a_slice
    acc = tl.full([BLOCK_M, BLOCK_R], 0.0, tl.float32)
    for k_start in range(0, in_features, BLOCK_K):
        k = k_start + tl.arange(0, BLOCK_K)
        k_mask = k < in_features
        x = tl.load(x_ptr + rows[:, None] * stride_x + k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        a_t = tl.load(a_base + r[None, :] * stride_a_rank + k[:, None], mask=r_mask[None, :] & k_mask[:, None], other=0.0)
        acc += tl.dot(x, a_t, input_precision=PRECISION)
    s = s_ptr + rows[:, None] * stride_s_token + slice_index * stride_s_slice + r[None, :]
    tl.store(s, acc, mask=m_mask[:, None] & r_mask[None, :])


@triton.jit
def _expand_kernel(
    s_ptr, b_ptr, y_ptr, offsets_ptr, rows_ptr, block_slot_ptr, block_start_ptr, block_rows_ptr,
    rank,
    stride_s_token, stride_s_slice, stride_b_slot, stride_b_row, stride_y,
    BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):
    slice_index = tl.program_id(1)
    slot, rows, m_mask = _block(rows_ptr, block_slot_ptr, block_start_ptr, block_rows_ptr, BLOCK_M)
    cols = tl.load(offsets_ptr + slice_index) + tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    c_mask = cols < tl.load(offsets_ptr + slice_index + 1)
    r = tl.arange(0, BLOCK_R)
    r_mask = r < rank
    s = tl.load(
        s_ptr + rows[:, None] * stride_s_token + slice_index * stride_s_slice + r[None, :],
        mask=m_mask[:, None] & r_mask[None, :],
        other=0.0,
    )
    b_t = tl.load(
        b_ptr + slot * stride_b_slot + cols[None, :] * stride_b_row + r[:, None], mask=r_mask[:, None] & c_mask[None, :], other=0.0
    ).to(tl.float32)
    delta = tl.dot(s, b_t, input_precision="ieee")
    y = y_ptr + rows[:, None] * stride_y + cols[None, :]
    mask = m_mask[:, None] & c_mask[None, :]
    tl.store(y, (tl.load(y, mask=mask, other=0.0).to(tl.float32) + delta).to(y_ptr.dtype.element_ty), mask=mask)


def _block_r(rank: int) -> int:
    return max(16, triton.next_power_of_2(rank))  # tl.dot needs at least 16 on each side


# Past rank 64 (shrink) or 32 (expand), 8 warps, and the expand's programs take 32 output
# features instead of 64: its fp32 s @ B.T multiplies with FMAs, operands in registers. The
# shapes that spill nothing on sm_80 and sm_90 (tests/engine/kernels/test_triton_compiles.py).
def shrink_meta(dtype: torch.dtype, rank: int) -> dict:
    """_shrink_kernel's constexprs and num_warps for inputs of `dtype` and adapters of `rank`."""
    block_r = _block_r(rank)
    return dict(BLOCK_M=KERNEL_BLOCK_ROWS, BLOCK_R=block_r, BLOCK_K=BLOCK_K, num_warps=4 if block_r <= 64 else 8,
                PRECISION="ieee" if dtype == torch.float32 else "tf32")  # the latter is ignored for 16-bit inputs


def expand_meta(rank: int) -> dict:
    """_expand_kernel's constexprs and num_warps for adapters of `rank`."""
    block_r = _block_r(rank)
    return dict(BLOCK_M=KERNEL_BLOCK_ROWS, BLOCK_R=block_r, BLOCK_N=64 if block_r <= 32 else 32,
                num_warps=4 if block_r <= 32 else 8)


def lora_shrink(x: torch.Tensor, a: torch.Tensor, batch: LoRABatch) -> torch.Tensor:
    """x [T, in], a [slots, slices, rank, in] -> s [T, slices, rank] fp32, filled on the rows of `batch`'s blocks."""
    tokens, (_, slices, rank, in_features) = x.shape[0], a.shape
    assert x.stride(1) == 1 and a.stride(3) == 1 and x.shape[1] == in_features and x.dtype == a.dtype
    s = torch.empty(tokens, slices, rank, device=x.device, dtype=torch.float32)
    _shrink_kernel[(batch.block_slot.numel(), slices)](
        x, a, s, batch.rows, batch.block_slot, batch.block_start, batch.block_rows,
        in_features, rank,
        x.stride(0), a.stride(0), a.stride(1), a.stride(2), s.stride(0), s.stride(1),
        **shrink_meta(x.dtype, rank),
    )
    return s


def lora_expand_(y: torch.Tensor, s: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor, max_slice: int, batch: LoRABatch) -> None:
    """y [T, out] += per slice i, s[:, i] @ b[slot, offsets[i]:offsets[i+1]].T on the rows of `batch`'s blocks;
    b [slots, out, rank], offsets [slices + 1] int32."""
    slices, rank = s.shape[1], s.shape[2]
    assert y.stride(1) == 1 and b.stride(2) == 1 and y.shape[1] == b.shape[1]
    meta = expand_meta(rank)
    _expand_kernel[(batch.block_slot.numel(), slices, triton.cdiv(max_slice, meta["BLOCK_N"]))](
        s, b, y, offsets, batch.rows, batch.block_slot, batch.block_start, batch.block_rows,
        rank,
        s.stride(0), s.stride(1), b.stride(0), b.stride(1), y.stride(0),
        **meta,
    )
