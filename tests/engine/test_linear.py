"""The projections' matmul (engine.linear): bf16 weights packed for oneDNN give F.linear's
results at every row count, and other dtypes stay plain tensors."""

import pytest
import torch
import torch.nn.functional as F

from engine.linear import PACKED_FOR_ROWS, Weight


@pytest.mark.parametrize("rows", [1, 3, PACKED_FOR_ROWS, 200])
def test_packed_bf16_weights_give_f_linears_result(rows):
    generator = torch.Generator().manual_seed(rows)
    plain = torch.randn(96, 48, generator=generator).bfloat16()
    x, bias = torch.randn(rows, 48, generator=generator).bfloat16(), torch.randn(96, generator=generator).bfloat16()
    weight = Weight(plain)
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN: nothing is packed")
    assert weight.packed is not None and weight.plain is None and weight.nbytes == plain.numel() * 2
    # both run oneDNN's bf16 kernel with fp32 accumulation; packing only reorders the weights
    torch.testing.assert_close(weight(x, bias), F.linear(x, plain, bias), rtol=0, atol=0)


def test_fp32_weights_stay_plain_and_a_kept_plain_copy_is_counted():
    fp32 = torch.randn(8, 4)
    weight = Weight(fp32)
    assert weight.packed is None and weight.plain is fp32 and weight.nbytes == fp32.numel() * 4
    x = torch.randn(2, 4)
    assert torch.equal(weight(x), F.linear(x, fp32))
    if torch.backends.mkldnn.is_available():
        both = Weight(fp32.bfloat16(), keep_plain=True)
        assert both.packed is not None and both.plain is not None and both.nbytes == 2 * fp32.numel() * 2
