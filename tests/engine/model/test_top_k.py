"""The C++ top-k of the logits' refinement against torch.topk: the same values picked (bf16 rows
tie often, so the indices may differ among equals), every index once, and bad arguments refused."""

import re

import pytest
import torch

from engine.kernels.cpu_build import cpu_kernel
from engine.model.top_k import top_k_indices

pytestmark = pytest.mark.skipif(cpu_kernel() is None, reason="the CPU kernels did not build")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows, width, k", [(1, 8, 8), (1, 100, 1), (5, 49152, 8), (300, 1000, 64), (3, 65, 64)])
def test_it_picks_the_values_torch_topk_picks(dtype, rows, width, k):
    values = torch.randn(rows, width, generator=torch.Generator().manual_seed(width + k)).to(dtype)
    picked = top_k_indices(values, k)
    assert picked.shape == (rows, k) and picked.dtype == torch.int64
    assert all(len(set(row)) == k for row in picked.tolist())
    expected = values.topk(k, dim=-1).values.sort(-1).values
    assert torch.equal(values.gather(1, picked).sort(-1).values, expected)


def test_a_row_of_nan_and_infinity_still_gets_k_distinct_indices_of_its_own():
    """Which ones is unspecified there (finite-math build), but nothing outside the row."""
    values = torch.randn(3, 300)
    values[0, :5] = float("nan")
    values[1, ::7] = float("inf")
    values[2] = float("nan")
    for row in top_k_indices(values, 8).tolist():
        assert len(set(row)) == 8 and all(0 <= i < 300 for i in row)


@pytest.mark.parametrize("shape, k, message", [
    ((2, 10), 0, "k must be in [1, min(64, width)], got 0"),
    ((2, 10), 11, "k must be in [1, min(64, width)], got 11"),
    ((2, 100), 65, "k must be in [1, min(64, width)], got 65"),
    ((10,), 3, "values: contiguous [rows, width]"),
])
def test_the_kernel_refuses_what_it_cannot_rank(shape, k, message):
    with pytest.raises(RuntimeError, match=re.escape(message)):
        cpu_kernel().top_k_indices(torch.randn(shape), k)


def test_a_transposed_view_is_ranked_by_its_rows():
    values = torch.randn(50, 4).t()  # not contiguous: the wrapper copies it
    assert torch.equal(values.gather(1, top_k_indices(values, 5)).sort(-1).values, values.topk(5).values.sort(-1).values)


def test_a_k_beyond_the_kernels_array_goes_to_torch():
    values = torch.randn(2, 200)
    assert torch.equal(values.gather(1, top_k_indices(values, 100)).sort(-1).values, values.topk(100).values.sort(-1).values)
