"""The dequantising matmul for CUDA, in Triton: y = x @ W.T with W stored as int8 codes (one
scale a row) or int4 codes packed two to a byte along the input dim (a scale and a zero a group
of input columns), dequantised tile by tile in registers, never in memory.

Each program computes a BLOCK_M x BLOCK_N tile of y over K in BLOCK_K steps; BLOCK_K divides
the int4 group size, so a step's columns share one scale and zero per output row. Accumulation is
fp32; the dequantised tile is cast to x's dtype for tl.dot (exact fp32 under the interpreter).
Checked against the torch reference under TRITON_INTERPRET=1 (fp32); not yet run on a GPU."""

import torch
import triton
import triton.language as tl

from engine.quant.quantize import INT4_MID

BLOCK_M = 16
BLOCK_N = 64
BLOCK_K = 32  # divides every int4 group size (32..256)


@triton.jit
def _dequant_matmul_kernel(
    x_ptr, q_ptr, scale_ptr, zero_ptr, y_ptr,
    M, N, K,
    stride_xm, stride_qn, stride_sn, stride_ym,
    BITS: tl.constexpr, GROUP: tl.constexpr, MID: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask, n_mask = m < M, n < N
    acc = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
    for k_start in range(0, K, BLOCK_K):
        k = k_start + tl.arange(0, BLOCK_K)
        k_mask = k < K
        x = tl.load(x_ptr + m[:, None] * stride_xm + k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        scale = tl.load(scale_ptr + n * stride_sn + k_start // GROUP, mask=n_mask, other=0.0).to(tl.float32)
        if BITS == 4:
            packed = tl.load(q_ptr + n[None, :] * stride_qn + (k // 2)[:, None], mask=n_mask[None, :] & k_mask[:, None], other=0)
            codes = (packed >> ((k % 2) * 4)[:, None]) & 15  # [BLOCK_K, BLOCK_N]
            zero = tl.load(zero_ptr + n * stride_sn + k_start // GROUP, mask=n_mask, other=0.0).to(tl.float32)
            w = (codes.to(tl.float32) - MID) * scale[None, :] + zero[None, :]
        else:
            codes = tl.load(q_ptr + n[None, :] * stride_qn + k[:, None], mask=n_mask[None, :] & k_mask[:, None], other=0)
            w = codes.to(tl.float32) * scale[None, :]
        acc += tl.dot(x, w.to(x.dtype), input_precision=PRECISION)
    y = y_ptr + m[:, None] * stride_ym + n[None, :]
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def dequant_meta(dtype: torch.dtype, bits: int, group: int) -> dict:
    """_dequant_matmul_kernel's constexprs and num_warps for inputs of `dtype` and weights of
    `bits` in groups of `group` columns. float32 (no TF32) multiplies with FMAs, operands in
    registers: 8 warps, the shape that spills nothing on sm_80 and sm_90
    (tests/engine/kernels/test_triton_compiles.py)."""
    return dict(BITS=bits, GROUP=group, MID=INT4_MID, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                num_warps=8 if dtype == torch.float32 else 4,
                PRECISION="ieee" if dtype == torch.float32 else "tf32")  # the latter is ignored for 16-bit inputs


def dequant_matmul(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, bits: int,
                   group: int) -> torch.Tensor:
    """x [M, K] @ W.T, W [N, K]: int8 codes [N, K] and scale [N, 1]; or int4 codes packed [N, K/2]
    (byte j: column 2j low nibble, 2j+1 high) with scale and zero [N, K/group]. Out [M, N] in x's dtype."""
    m, k = x.shape
    n = codes.shape[0]
    assert x.stride(1) == 1 and codes.stride(1) == 1 and (bits == 8 or group % BLOCK_K == 0)
    y = torch.empty(m, n, device=x.device, dtype=x.dtype)
    _dequant_matmul_kernel[(triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))](
        x, codes, scale, scale if zero is None else zero, y,
        m, n, k,
        x.stride(0), codes.stride(0), scale.stride(0), y.stride(0),
        **dequant_meta(x.dtype, bits, group),
    )
    return y
