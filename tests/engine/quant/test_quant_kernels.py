"""The quantised weights (engine/quant/) against the unquantised ones, on random weights, at
every row count on both sides of the kernel choice. Every tolerance is derived from the width
and the sizes: half a quantisation step a weight (and the zero's rounding), carried through the
matmul, plus bf16 rounding of the weights the kernel multiplies and of its outputs."""

import pytest
import torch
import torch.nn.functional as F

from engine.quant.int4_weight import Int4Weight, pack_int4, tile_rows, unpack_int4
from engine.quant.int8_embedding import Int8Embedding
from engine.quant.int8_weight import Int8Weight
from engine.quant.kernel_choice import DEQUANTIZE_FROM
from engine.quant.quantize import (INT4_LEVELS, INT4_MID, dequantize_int4_groups, dequantize_int8_rows,
                                   quantize_int4_groups, quantize_int8_rows)

BF16_EPS = torch.finfo(torch.bfloat16).eps  # 2^-7, the spacing of bf16 values at 1
UNIT = BF16_EPS / 2  # rounding to the nearest bf16 changes a value by at most this, relative
FP32_EPS = torch.finfo(torch.float32).eps
OUT, IN = 192, 256  # a multiple of the int4 kernel's 64-row tiles and of every group size


def weights(seed: int, out: int = OUT, inp: int = IN) -> torch.Tensor:
    """bf16 weights like a checkpoint's: mostly small, with a few large columns."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, inp, generator=g) * 0.05
    w[:, torch.randperm(inp, generator=g)[:4]] *= 8
    return w.bfloat16()


def rows_to_try(width: str) -> list[int]:
    return [1, 7, DEQUANTIZE_FROM[width] - 1, DEQUANTIZE_FROM[width], 300]


def rounding_tolerance(x: torch.Tensor, weight, reference: torch.Tensor) -> torch.Tensor:
    """What bf16 adds to an exact x @ dequantised.T: each weight's rounding on its way to bf16
    (dequantise_rounding), fp32 accumulation over the inputs, the output rounded to bf16."""
    exact = weight.dequantized(torch.float32)
    magnitude = x.float().abs() @ exact.abs().T
    return x.float().abs() @ dequantise_rounding(weight).T + x.shape[-1] * FP32_EPS * magnitude + UNIT * reference.abs()


def dequantise_rounding(weight) -> torch.Tensor:
    """A bound on |bf16 weight - exact dequantised weight|: int8 is code x scale, rounded once; int4
    is code x scale + (zero - 8 x scale), with the offset, the product and the sum each rounded."""
    exact = weight.dequantized(torch.float32)
    if weight.width == "int8":
        return UNIT * exact.abs()
    scale, zero = (t.float().T.repeat_interleave(weight.group, dim=1) for t in weight.scale_and_zero.unbind(-1))
    return UNIT * ((zero - INT4_MID * scale).abs() * (1 + UNIT) + weight.codes().float() * scale + exact.abs()) * (1 + UNIT)


# --- the quantisation itself --------------------------------------------------------


def test_int8_gives_every_weight_back_within_half_a_step():
    w = weights(0)
    codes, scale = quantize_int8_rows(w)
    assert codes.dtype == torch.int8 and scale.dtype == torch.bfloat16 and int(codes.abs().max()) <= 127
    error = (dequantize_int8_rows(codes, scale) - w.float()).abs()
    # the scale is rounded up, so no weight is clamped: half a step, and fp32's own rounding
    assert bool((error <= scale.float()[:, None] / 2 * (1 + 4 * FP32_EPS)).all())


@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_groups_have_no_more_error_than_their_min_max_grid(group):
    w = weights(1)
    codes, scale, zero = quantize_int4_groups(w, group)
    assert codes.dtype == torch.uint8 and int(codes.max()) <= INT4_LEVELS and scale.shape == (OUT, IN // group)
    grouped = w.float().view(OUT, IN // group, group)
    low, high = grouped.amin(-1), grouped.amax(-1)
    step = (high - low) / INT4_LEVELS * (1 + BF16_EPS)  # the min/max grid's step, rounded up to bf16
    # a weight of the min/max grid is within half its step, or within its zero's bf16 rounding of the end
    bound = step / 2 + (low + INT4_MID * step).abs() * BF16_EPS
    rms = (dequantize_int4_groups(codes, scale, zero) - w.float()).view_as(grouped).square().mean(-1).sqrt()
    assert bool((rms <= bound * (1 + 1e-4)).all())


def test_the_refit_finds_a_4bit_checkpoints_grid_that_bf16_scales_miss():
    """Weights from a checkpoint stored in 4 bits (as GGUF's Q4_1: a step and a minimum in fp16 per
    32 weights, codes 0..15): the min/max grid's step, rounded up to bf16, drifts from theirs by up to
    15 codes' worth of the rounding; the least-squares refit puts the grid back on them."""
    g = torch.Generator().manual_seed(2)
    codes = torch.randint(0, 16, (OUT, IN // 32, 32), generator=g).float()
    codes[..., 0], codes[..., 1] = 0, 15
    step = (torch.rand(OUT, IN // 32, 1, generator=g) * 0.002 + 0.001).half().float()
    low = (torch.randn(OUT, IN // 32, 1, generator=g) * 0.01).half().float()
    w = (codes * step + low).view(OUT, IN).bfloat16()

    def rms(refine_steps):
        return float((dequantize_int4_groups(*quantize_int4_groups(w, 32, refine_steps)) - w.float()).square().mean().sqrt())

    assert rms(2) < rms(0) / 2


def test_the_packed_int4_layout_reads_back():
    assert tile_rows() in (32, 64)  # 64-row tiles with AVX512, 32 with AVX2 only
    codes = quantize_int4_groups(weights(3), 32)[0]
    assert torch.equal(unpack_int4(pack_int4(codes), OUT, IN), codes)


# --- the projections: quantised kernels against the unquantised weight -------------------


def projection_bound(x: torch.Tensor, w: torch.Tensor, weight) -> torch.Tensor:
    """|quantised(x) - x @ w.T| per output, from the stored grid: per group (a row for int8), the
    inputs' norm times the weights' error norm (Cauchy-Schwarz), then bf16's rounding."""
    exact = weight.dequantized(torch.float32)
    group = weight.group if weight.width == "int4" else IN
    error_norm = (exact - w.float()).view(OUT, IN // group, group).norm(dim=-1)  # [out, groups]
    x_norm = x.float().view(-1, IN // group, group).norm(dim=-1)  # [rows, groups]
    return x_norm @ error_norm.T + rounding_tolerance(x, weight, x.float() @ exact.T)


@pytest.mark.parametrize("make", [Int8Weight, lambda w: Int4Weight(w, 32), lambda w: Int4Weight(w, 64),
                                  lambda w: Int4Weight(w, 128)], ids=["int8", "int4-g32", "int4-g64", "int4-g128"])
def test_every_quantised_projection_is_within_its_derived_bound_of_the_unquantised_one(make):
    w = weights(4)
    weight = make(w)
    for rows in rows_to_try(weight.width):
        x = torch.randn(rows, IN, generator=torch.Generator().manual_seed(rows)).bfloat16()
        out = weight(x).float()
        reference = x.float() @ w.float().T
        bound = projection_bound(x, w, weight)
        assert out.shape == (rows, OUT) and bool(((out - reference).abs() <= bound).all()), rows


@pytest.mark.parametrize("make", [Int8Weight, lambda w: Int4Weight(w, 64)], ids=["int8", "int4"])
def test_both_kernel_paths_multiply_by_the_same_quantised_weight(make):
    """The weight-only kernel (few rows) and the dequantise-then-bf16 path (many rows) each give
    x @ dequantised.T within bf16's rounding."""
    weight = make(weights(5))
    exact = weight.dequantized(torch.float32)
    for rows in rows_to_try(weight.width):
        x = torch.randn(rows, IN, generator=torch.Generator().manual_seed(rows)).bfloat16()
        reference = x.float() @ exact.T
        assert bool(((weight(x).float() - reference).abs() <= rounding_tolerance(x, weight, reference)).all()), rows


def test_a_bias_is_added_and_leading_dims_are_kept():
    weight = Int4Weight(weights(6), 32)
    x, bias = torch.randn(2, 3, IN).bfloat16(), torch.randn(OUT).bfloat16()
    assert torch.equal(weight(x, bias), weight(x) + bias)
    assert torch.equal(weight(x)[1], weight(x[1]))


def test_weight_bytes_are_what_the_width_stores():
    w = weights(7)
    int8, int4 = Int8Weight(w), Int4Weight(w, 32)
    assert int8.nbytes == int8.read_bytes == OUT * IN + OUT * 2  # a byte a weight, a bf16 scale a row
    assert int4.nbytes == int4.read_bytes == OUT * IN // 2 + OUT * IN // 32 * 2 * 2  # half a byte, a bf16 scale and zero a group
    assert int8.plain is None and int4.plain is None


def test_the_int8_embedding_gathers_rows_within_half_a_step():
    table = weights(8, out=1000, inp=64)
    embedding = Int8Embedding(table)
    ids = torch.tensor([[3, 999], [0, 3]])
    rows = embedding[ids]
    assert rows.shape == (2, 2, 64) and rows.dtype == torch.bfloat16
    step = embedding.scale[ids].float().unsqueeze(-1)
    # half a step, then the row's rounding to bf16
    assert bool(((rows.float() - table[ids].float()).abs() <= step / 2 + table[ids].float().abs() * BF16_EPS).all())
    assert embedding.nbytes == 1000 * 64 + 1000 * 2 and embedding.row_bytes == 64 + 2
    torch.testing.assert_close(F.embedding(ids, embedding.codes * embedding.scale[:, None]), rows, rtol=0, atol=0)
