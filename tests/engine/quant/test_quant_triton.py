"""The Triton dequantising matmul (engine/quant/triton_matmul.py) against x @ W.T with W
dequantised by the torch reference (engine/quant/quantize.py), on small shapes. On a CPU it runs
under TRITON_INTERPRET=1, in float32 and float16 (the interpreter's bfloat16 tl.dot is wrong);
on CUDA in bfloat16 too."""

import pytest
import torch

from common.quant_spec import LayerQuant
from tests.helpers.triton_on_cpu import DEVICE, DTYPES, interpret_on_a_cpu  # noqa: F401 (an autouse fixture)

OUT, IN = 96, 128  # OUT not a multiple of the kernel's 64-column tile: the edge is masked


@pytest.fixture
def weight_kind(interpret_on_a_cpu):
    from engine.quant.triton_weight import TritonQuantWeight  # imported here, under the interpreter on a CPU

    return TritonQuantWeight


def tolerance(x: torch.Tensor, w: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """fp32 accumulation over the inputs, the dequantised weight rounded to x's dtype for tl.dot
    (exact in float32), the output rounded to x's dtype."""
    unit = 0.0 if x.dtype == torch.float32 else torch.finfo(x.dtype).eps / 2
    magnitude = x.float().abs() @ w.abs().T
    return (x.shape[1] * torch.finfo(torch.float32).eps + unit) * magnitude + torch.finfo(x.dtype).eps / 2 * reference.abs()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layer", [LayerQuant("int8"), LayerQuant("int4", 32), LayerQuant("int4", 64)], ids=str)
@pytest.mark.parametrize("rows", [1, 5, 17])
def test_the_kernel_multiplies_by_the_dequantised_weight(weight_kind, layer, dtype, rows):
    g = torch.Generator().manual_seed(rows)
    w = (torch.randn(OUT, IN, generator=g) * 0.05).to(dtype).to(DEVICE)
    weight = weight_kind(w, layer)
    x = torch.randn(rows, IN, generator=g).to(dtype).to(DEVICE)
    exact = weight.dequantized(torch.float32)
    reference = x.float() @ exact.T
    out = weight(x)
    assert out.shape == (rows, OUT) and out.dtype == dtype
    assert bool(((out.float() - reference).abs() <= tolerance(x, exact, reference)).all())


def test_int4_codes_are_packed_two_to_a_byte_and_read_back(weight_kind):
    from engine.quant.quantize import quantize_int4_groups

    w = torch.randn(OUT, IN).to(DEVICE) * 0.05
    weight = weight_kind(w, LayerQuant("int4", 32))
    codes, scale, zero = quantize_int4_groups(w, 32)
    assert weight.codes.shape == (OUT, IN // 2) and weight.nbytes == OUT * IN // 2 + 2 * scale.nbytes
    assert torch.equal(torch.stack([weight.codes & 15, weight.codes >> 4], -1).view(OUT, IN), codes)


def test_a_bias_and_leading_dims(weight_kind):
    weight = weight_kind(torch.randn(OUT, IN).to(DEVICE), LayerQuant("int8"))
    x, bias = torch.randn(2, 3, IN).to(DEVICE), torch.randn(OUT).to(DEVICE)
    torch.testing.assert_close(weight(x, bias), weight(x.view(6, IN)).view(2, 3, OUT) + bias)
