"""The projections' matmul (engine.model.linear): bf16 weights in the blocked layout of this project's
kernels (AVX512-BF16, AMX where the CPU has it, AVX2 without AVX512-BF16) give x W^T (+ bias) within bf16's rounding
at every row count (checked in float64),
weights the kernel cannot take are packed for oneDNN and give F.linear's results, and other
dtypes stay plain tensors."""

import pytest
import torch
import torch.nn.functional as F

from engine.kernels.cpu_build import cpu_kernel
from engine.model.linear import PACKED_FOR_ROWS, Weight, blocked_kernel, onednn_packs_bf16, to_blocked

BF16_UNIT_ROUNDOFF = 2.0**-8  # 8 significant bits, rounded to nearest
FP32_UNIT_ROUNDOFF = 2.0**-24


def needs_blocked_kernel():
    if blocked_kernel(torch.zeros(16, 2, dtype=torch.bfloat16)) is None:
        pytest.skip("no AVX512-BF16 or AVX2 build of the CPU kernels here: the blocked layout is not used")


def test_blocked_layout_puts_16_columns_by_pairs_of_inputs():
    weight = torch.arange(32 * 6, dtype=torch.float32).view(32, 6).bfloat16()  # integers < 256: exact in bf16
    blocked = to_blocked(weight)
    assert blocked.shape == (2, 3, 16, 2)
    for block, pair, column, half in [(0, 0, 0, 0), (1, 2, 15, 1), (0, 1, 7, 1), (1, 0, 3, 0)]:
        assert blocked[block, pair, column, half] == weight[16 * block + column, 2 * pair + half]


def within_bf16_rounding(got: torch.Tensor, x: torch.Tensor, plain: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether `got` is x plain^T (+ bias) as fp32 accumulation rounded once to bf16 can give it."""
    in_features = x.shape[1]
    exact = x.double() @ plain.double().T + (bias.double() if bias is not None else 0)
    # bf16 x bf16 products are exact in fp32; summing in_features of them (and the bias) in
    # fp32 errs by at most (in_features + 1) u32 times the sum of magnitudes; rounding to bf16
    # adds at most u16 of the result
    magnitudes = x.double().abs() @ plain.double().abs().T + (bias.double().abs() if bias is not None else 0)
    bound = BF16_UNIT_ROUNDOFF * exact.abs() + (1 + BF16_UNIT_ROUNDOFF) * (in_features + 1) * FP32_UNIT_ROUNDOFF * magnitudes
    return got.dtype == torch.bfloat16 and bool(((got.double() - exact).abs() <= bound).all())


# 1-8 rows are one register tile; 9, 13 and 200 need several and a partial last one; a tile
# spans three 16-column blocks: 48 outputs are one whole tile, 64 and 80 end with 1 and 2 blocks.
# 70 inputs are not whole AMX tiles (32), so this is the AVX512-BF16 kernel wherever it runs
@pytest.mark.parametrize("rows", [1, 2, 5, 8, 9, 13, PACKED_FOR_ROWS, 200])
@pytest.mark.parametrize("out_features", [48, 64, 80])
@pytest.mark.parametrize("with_bias", [False, True])
def test_blocked_bf16_weights_give_the_float64_result_within_bf16_rounding(rows, out_features, with_bias):
    needs_blocked_kernel()
    generator = torch.Generator().manual_seed(rows * out_features)
    plain = torch.randn(out_features, 70, generator=generator).bfloat16()
    x = torch.randn(rows, 70, generator=generator).bfloat16()
    bias = torch.randn(out_features, generator=generator).bfloat16() if with_bias else None
    weight = Weight(plain)
    assert weight.layout == "blocked" and weight.plain is None and weight.nbytes == plain.numel() * 2
    assert within_bf16_rounding(weight(x, bias), x, plain, bias)


# AMX tiles are 16 rows by 32 inputs and a call multiplies up to 2 x 2 of them: 1, 15 rows are
# one short row tile, 16 one whole, 17 and 31 a whole and a short, 32 two whole, 33 and 200 end
# with a short one; 48 and 80 outputs (3 and 5 blocks) end with a lone block; 96 and 1,536
# inputs are 3 and 48 tiles. amx=False runs the AVX512-BF16 kernel on the same inputs
@pytest.mark.parametrize("rows", [1, 15, 16, 17, 31, 32, 33, 200])
@pytest.mark.parametrize("out_features,in_features", [(48, 96), (64, 96), (80, 1536)])
@pytest.mark.parametrize("amx", [True, False])
def test_both_kernels_give_the_float64_result_within_bf16_rounding_on_whole_amx_tiles(rows, out_features, in_features, amx):
    needs_blocked_kernel()
    if amx and not cpu_kernel().amx_ready():
        pytest.skip("this CPU (or its kernel build) has no AMX")
    generator = torch.Generator().manual_seed(rows * out_features + in_features)
    plain = torch.randn(out_features, in_features, generator=generator).bfloat16()
    x = torch.randn(rows, in_features, generator=generator).bfloat16()
    bias = torch.randn(out_features, generator=generator).bfloat16()
    got = cpu_kernel().linear_bf16(x, to_blocked(plain), bias, amx=amx)
    assert within_bf16_rounding(got, x, plain, bias)
    assert within_bf16_rounding(cpu_kernel().linear_bf16(x, to_blocked(plain), amx=amx), x, plain, None)


def test_a_weight_that_is_a_view_is_blocked_from_its_values():
    needs_blocked_kernel()
    stored = torch.randn(64, 48).bfloat16()
    transposed = stored.t()  # [48, 64], not contiguous
    x = torch.randn(3, 64).bfloat16()
    assert torch.equal(Weight(transposed)(x), Weight(transposed.contiguous())(x))


def test_the_blocked_kernel_refuses_mismatched_inputs_with_a_message():
    needs_blocked_kernel()
    weight = Weight(torch.randn(32, 8).bfloat16())
    with pytest.raises(RuntimeError, match="x has 6 columns, the weight takes 8"):
        weight(torch.randn(2, 6).bfloat16())
    with pytest.raises(RuntimeError, match=r"x must be \[rows, K\] bfloat16"):
        weight(torch.randn(2, 8))
    with pytest.raises(RuntimeError, match="bias must be 32 contiguous bfloat16"):
        weight(torch.randn(2, 8).bfloat16(), torch.randn(16).bfloat16())


@pytest.mark.parametrize("rows", [1, 3, PACKED_FOR_ROWS, 200])
def test_weights_the_kernel_cannot_block_are_packed_for_onednn_where_it_can_with_f_linears_result(rows):
    generator = torch.Generator().manual_seed(rows)
    plain = torch.randn(100, 48, generator=generator).bfloat16()  # 100 outputs: not whole 16-column blocks
    x, bias = torch.randn(rows, 48, generator=generator).bfloat16(), torch.randn(100, generator=generator).bfloat16()
    weight = Weight(plain)
    if onednn_packs_bf16():
        assert weight.layout == "onednn" and weight.plain is None and weight.nbytes == plain.numel() * 2
    else:  # an AVX2-only CPU: oneDNN refuses to pack bf16, and the plain tensor serves
        assert weight.layout == "plain" and weight.plain is plain and weight.nbytes == plain.numel() * 2
    # both run oneDNN's bf16 kernel with fp32 accumulation; packing only reorders the weights
    torch.testing.assert_close(weight(x, bias), F.linear(x, plain, bias), rtol=0, atol=0)


def test_fp32_weights_stay_plain_and_a_kept_plain_copy_is_counted():
    fp32 = torch.randn(16, 4)
    weight = Weight(fp32)
    assert weight.layout == "plain" and weight.packed is None and weight.plain is fp32 and weight.nbytes == fp32.numel() * 4
    x = torch.randn(2, 4)
    assert torch.equal(weight(x), F.linear(x, fp32))
    if onednn_packs_bf16() or blocked_kernel(fp32.bfloat16()) is not None:
        both = Weight(fp32.bfloat16(), keep_plain=True)
        assert both.packed is not None and both.plain is not None and both.nbytes == 2 * fp32.numel() * 2
