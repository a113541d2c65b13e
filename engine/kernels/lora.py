"""LoRA shrink and expand for a batch whose tokens use different adapters (punica's BGMV idea).

shrink: s[t, i, :] = A[slot[t], i] @ x[t]             for every output slice i
expand: y[t, slice i] += B[slot[t], slice i] @ s[t, i]
One program per (token, slice, block); tokens with slot -1 (the base model) are masked
off. Accumulation is in fp32 whatever the activation dtype."""

import torch
import triton
import triton.language as tl

BLOCK_K = 64  # input features per shrink iteration
BLOCK_N = 64  # output features per expand program


@triton.jit
def _shrink_kernel(
    x_ptr, a_ptr, slot_ptr, s_ptr,
    in_features, rank,
    stride_x, stride_a_slot, stride_a_slice, stride_a_rank, stride_s_token, stride_s_slice,
    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
):
    token = tl.program_id(0)
    slice_index = tl.program_id(1)
    slot = tl.load(slot_ptr + token)
    # base-model tokens read nothing: every mask compares against a limit of 0
    limit = tl.where(slot >= 0, in_features, 0)
    a_base = a_ptr + tl.maximum(slot, 0) * stride_a_slot + slice_index * stride_a_slice
    r = tl.arange(0, BLOCK_R)
    acc = tl.zeros([BLOCK_R], dtype=tl.float32)
    for k_start in range(0, in_features, BLOCK_K):
        k = k_start + tl.arange(0, BLOCK_K)
        k_mask = k < limit
        x = tl.load(x_ptr + token * stride_x + k, mask=k_mask, other=0.0).to(tl.float32)
        a = tl.load(
            a_base + r[:, None] * stride_a_rank + k[None, :], mask=(r[:, None] < rank) & k_mask[None, :], other=0.0
        ).to(tl.float32)
        acc += tl.sum(a * x[None, :], axis=1)
    tl.store(s_ptr + token * stride_s_token + slice_index * stride_s_slice + r, acc, mask=r < rank)


@triton.jit
def _expand_kernel(
    s_ptr, b_ptr, slot_ptr, offsets_ptr, y_ptr,
    rank,
    stride_s_token, stride_s_slice, stride_b_slot, stride_b_row, stride_y,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):
    token = tl.program_id(0)
    slice_index = tl.program_id(1)
    block = tl.program_id(2)
    slot = tl.load(slot_ptr + token)
    start = tl.load(offsets_ptr + slice_index)
    end = tl.where(slot >= 0, tl.load(offsets_ptr + slice_index + 1), start)  # base-model tokens: no columns
    cols = start + block * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < end
    r = tl.arange(0, BLOCK_R)
    r_mask = r < rank
    s = tl.load(s_ptr + token * stride_s_token + slice_index * stride_s_slice + r, mask=r_mask, other=0.0)
    b = tl.load(
        b_ptr + tl.maximum(slot, 0) * stride_b_slot + cols[:, None] * stride_b_row + r[None, :],
        mask=col_mask[:, None] & r_mask[None, :],
        other=0.0,
    ).to(tl.float32)
    delta = tl.sum(b * s[None, :], axis=1)
    y = tl.load(y_ptr + token * stride_y + cols, mask=col_mask, other=0.0)
    tl.store(y_ptr + token * stride_y + cols, (y.to(tl.float32) + delta).to(y_ptr.dtype.element_ty), mask=col_mask)


def lora_shrink(x: torch.Tensor, a: torch.Tensor, slot_ids: torch.Tensor) -> torch.Tensor:
    """x [T, in], a [slots, slices, rank, in], slot_ids [T] int32 -> s [T, slices, rank] fp32
    (zero for base-model tokens)."""
    tokens, (_, slices, rank, in_features) = x.shape[0], a.shape
    assert x.stride(1) == 1 and a.stride(3) == 1 and x.shape[1] == in_features
    s = torch.empty(tokens, slices, rank, device=x.device, dtype=torch.float32)
    _shrink_kernel[(tokens, slices)](
        x, a, slot_ids, s,
        in_features, rank,
        x.stride(0), a.stride(0), a.stride(1), a.stride(2), s.stride(0), s.stride(1),
        BLOCK_R=triton.next_power_of_2(rank), BLOCK_K=BLOCK_K,
    )
    return s


def lora_expand_(y: torch.Tensor, s: torch.Tensor, b: torch.Tensor, slot_ids: torch.Tensor, offsets: torch.Tensor, max_slice: int) -> None:
    """y [T, out] += per slice i, s[:, i] @ b[slot, offsets[i]:offsets[i+1]].T; b [slots, out, rank]."""
    tokens, slices, rank = s.shape
    assert y.stride(1) == 1 and b.stride(2) == 1 and y.shape[1] == b.shape[1]
    grid = (tokens, slices, triton.cdiv(max_slice, BLOCK_N))
    _expand_kernel[grid](
        s, b, slot_ids, offsets, y,
        rank,
        s.stride(0), s.stride(1), b.stride(0), b.stride(1), y.stride(0),
        BLOCK_R=triton.next_power_of_2(rank), BLOCK_N=BLOCK_N,
    )
