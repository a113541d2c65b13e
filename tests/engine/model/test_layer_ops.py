"""The decoder layer's elementwise steps (engine/model/layer_ops.py), the fused C++ versions
(engine/kernels/csrc/layer_ops_cpu.cpp) and the torch ones they replace, against the same step
evaluated in float64 on the same inputs, in float32, bfloat16 and float16, at one row (a
decode), a few rows and a prefill's worth. The bounds count roundings: the fused versions
compute in float32 and round once to the dtype, the torch ones round after every op; both
write the cache where the slots say. Malformed arguments are refused and write nothing."""

import pytest
import torch

from engine.kernels.cpu_build import cpu_kernel
from engine.model import layer_ops

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
ROWS = [1, 5, 300]
HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64
SLOTS, POSITIONS = 1024, 2048
# roundings to the dtype on the way to each result: (fused, torch)
ROUNDINGS = {"add_rms_norm": (1, 2), "rotary_to_cache": (1, 2), "silu_mul": (1, 2)}
U32 = torch.finfo(torch.float32).eps / 2


@pytest.fixture(scope="module", autouse=True)
def kernel():
    assert cpu_kernel() is not None, "the CPU kernels did not build (see the warning logged)"


@pytest.fixture(params=["fused", "torch"])
def version(request, monkeypatch):
    """Which version engine/model/layer_ops.py runs, and how many roundings to the dtype it makes."""
    if request.param == "torch":
        monkeypatch.setattr(layer_ops, "cpu_kernel", lambda: None)
    return request.param


def roundings(step: str, version: str) -> int:
    return ROUNDINGS[step][version == "torch"]


def randn(generator, *shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=generator) * scale).to(dtype)


def half_subnormal(dtype: torch.dtype) -> float:
    """What one rounding to `dtype` may lose below its normals, whatever the value: half the
    subnormal spacing (float16's subnormals start at 6.1e-5)."""
    info = torch.finfo(dtype)
    return info.smallest_normal * info.eps / 2


def assert_within(actual: torch.Tensor, exact: torch.Tensor, bound: torch.Tensor):
    error = (actual.double() - exact).abs()
    assert bool((error <= bound + torch.finfo(torch.float32).tiny).all()), (error - bound).max()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("with_delta", [True, False])
def test_add_rms_norm_is_within_its_roundings_of_float64(dtype, rows, with_delta, version):
    generator = torch.Generator().manual_seed(rows)
    hidden = 576
    x = randn(generator, rows, hidden, scale=3.0)
    delta = randn(generator, rows, hidden, dtype=dtype) if with_delta else None
    weight = randn(generator, hidden, dtype=dtype)
    added = x + delta.float() if with_delta else x.clone()  # one float32 addition, as both versions
    actual = layer_ops.add_rms_norm(x, delta, weight, 1e-5)
    assert actual.dtype == dtype and torch.equal(x, added)
    x64 = added.double()
    exact = weight.double() * x64 * (x64.square().mean(-1, keepdim=True) + 1e-5).rsqrt()
    # each rounding to the dtype: half its eps of the value; the float32 sum of `hidden`
    # squares, the root and the products: (hidden + 4) float32 roundings
    u = torch.finfo(dtype).eps / 2
    n = roundings("add_rms_norm", version)
    # below the normals: the result's rounding, and the torch version's of the normalised x, scaled by the weight
    floor = half_subnormal(dtype) * (1 + (n - 1) * weight.double().abs())
    assert_within(actual, exact, exact.abs() * (n * u * 1.01 + (hidden + 4) * U32) + floor)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
def test_rotary_to_cache_is_within_its_roundings_of_float64(dtype, rows, version):
    generator = torch.Generator().manual_seed(100 + rows)
    qkv = randn(generator, rows, (HEADS + 2 * KV_HEADS) * HEAD_DIM, dtype=dtype)
    angles = torch.rand(POSITIONS, HEAD_DIM // 2, generator=generator) * 6.3
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    positions = torch.randint(0, POSITIONS, (rows,), generator=generator)
    slots = torch.randperm(SLOTS, generator=generator)[:rows]
    k_cache, v_cache = (torch.full((KV_HEADS, SLOTS, HEAD_DIM), float("nan"), dtype=dtype) for _ in range(2))
    q = layer_ops.rotary_to_cache(qkv, cos, sin, positions, slots, k_cache, v_cache, HEADS)
    assert q.shape == (rows, HEADS, HEAD_DIM) and q.dtype == dtype

    qk = qkv[:, : (HEADS + KV_HEADS) * HEAD_DIM].double().view(rows, HEADS + KV_HEADS, 2, HEAD_DIM // 2)
    first, second = qk[:, :, 0], qk[:, :, 1]
    c, s = cos[positions].double().unsqueeze(1), sin[positions].double().unsqueeze(1)
    exact = torch.cat([first * c - second * s, second * c + first * s], dim=-1)
    # a result rounded once is off by half an eps of itself; the torch version rounds the two
    # products too, each off by half an eps of itself: bound by the products' magnitudes
    magnitude = torch.cat([(first * c).abs() + (second * s).abs(), (second * c).abs() + (first * s).abs()], dim=-1)
    u = torch.finfo(dtype).eps / 2
    n = roundings("rotary_to_cache", version)
    bound = magnitude * (n * u * 1.01 + 3 * U32) + half_subnormal(dtype) * (1 + 2 * (n - 1))  # the result, two products
    assert_within(q, exact[:, :HEADS], bound[:, :HEADS])
    # the new K (rotated) and V (as projected) are where the slots say; nothing else was written
    assert_within(k_cache[:, slots].transpose(0, 1), exact[:, HEADS:], bound[:, HEADS:])
    v = qkv[:, (HEADS + KV_HEADS) * HEAD_DIM :].reshape(rows, KV_HEADS, HEAD_DIM)
    assert torch.equal(v_cache[:, slots].transpose(0, 1), v)
    untouched = torch.ones(SLOTS, dtype=torch.bool)
    untouched[slots] = False
    assert bool(k_cache[:, untouched].isnan().all() and v_cache[:, untouched].isnan().all())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
def test_silu_mul_is_within_its_roundings_of_float64(dtype, rows, version):
    generator = torch.Generator().manual_seed(200 + rows)
    gate_up = randn(generator, rows, 2 * 1536, dtype=dtype, scale=4.0)
    gate_up[0, :5] = torch.tensor([0.0, -100.0, 100.0, -30.0, -80.0]).to(dtype)  # zero and silu's far tails
    actual = layer_ops.silu_mul(gate_up)
    assert actual.dtype == dtype and actual.shape == (rows, 1536)
    gate, up = gate_up.double().chunk(2, dim=-1)
    exact = gate * gate.sigmoid() * up
    # exp within float32's eps, then a sum, a division and two products: 6 float32 roundings
    u = torch.finfo(dtype).eps / 2
    n = roundings("silu_mul", version)
    floor = half_subnormal(dtype) * (1 + (n - 1) * up.abs())  # the result, and the torch version's silu(gate) times up
    assert_within(actual, exact, exact.abs() * (n * u * 1.01 + 6 * U32) + floor)


def test_malformed_arguments_are_refused():
    kernel = cpu_kernel()
    x, weight = torch.zeros(2, 8), torch.ones(8)
    with pytest.raises(RuntimeError, match="float32"):
        kernel.add_rms_norm(x.double(), None, weight, 1e-5)
    with pytest.raises(RuntimeError, match="weight"):
        kernel.add_rms_norm(x, None, torch.ones(7), 1e-5)
    with pytest.raises(RuntimeError, match="delta"):
        kernel.add_rms_norm(x, torch.zeros(2, 8, dtype=torch.bfloat16), weight, 1e-5)

    k_cache, v_cache = torch.zeros(1, 4, 8), torch.zeros(1, 4, 8)
    qkv, table = torch.zeros(2, 3 * 8), torch.zeros(16, 4)
    positions, slots = torch.tensor([0, 1]), torch.tensor([2, 3])
    with pytest.raises(RuntimeError, match="outside the cache"):
        kernel.rotary_to_cache(qkv, table, table, positions, torch.tensor([2, 4]), k_cache, v_cache, 1)
    with pytest.raises(RuntimeError, match="outside the rotary tables"):
        kernel.rotary_to_cache(qkv, table, table, torch.tensor([0, 16]), slots, k_cache, v_cache, 1)
    with pytest.raises(RuntimeError, match="qkv"):
        kernel.rotary_to_cache(torch.zeros(2, 16), table, table, positions, slots, k_cache, v_cache, 1)
    with pytest.raises(RuntimeError, match="one dtype"):
        kernel.rotary_to_cache(qkv.bfloat16(), table, table, positions, slots, k_cache, v_cache, 1)
    with pytest.raises(RuntimeError, match="int64"):
        kernel.rotary_to_cache(qkv, table, table, positions.int(), slots, k_cache, v_cache, 1)
    assert torch.equal(k_cache, torch.zeros(1, 4, 8)), "a refused call writes nothing"

    with pytest.raises(RuntimeError, match="gate_up"):
        kernel.silu_mul(torch.zeros(2, 7))
