"""The Triton paged-attention kernel against the torch reference on random paged batches
(mixed prefill slices and decodes, chunks starting mid-block, GQA, two block sizes), the
reference itself against dense scaled_dot_product_attention, and the launcher's refusals.
On a CPU the kernel runs under TRITON_INTERPRET=1 (float32 and float16 only: the
interpreter's bfloat16 tl.dot is wrong); on CUDA bfloat16 is checked too."""

import random

import pytest
import torch
import torch.nn.functional as F

from engine.attention.torch_reference import paged_attention_reference
from tests.helpers.paged_attention_cases import MIXED, NUM_KV_HEADS, error_bound, paged_batch, random_specs
from tests.helpers.triton_on_cpu import DEVICE, DTYPES, interpret_on_a_cpu  # noqa: F401 (an autouse fixture)


@pytest.fixture
def kernel(interpret_on_a_cpu):
    from engine.attention.triton_kernel import paged_attention_triton

    return paged_attention_triton


def assert_matches_reference(actual, args, kernel_rounds_p_to, segments=1):
    """Both are within their error_bound of the exact result, so of each other within the sum."""
    from engine.attention.triton_kernel import launch_meta  # imported by the `kernel` fixture, under the interpreter on a CPU

    q, k_cache, block_tables, block_size = args[0], args[1], args[3], args[6]
    tile_n = launch_meta(q.dtype, q.shape[2], q.shape[1] // k_cache.shape[1], block_size,
                         q.shape[0] <= block_tables.shape[0])["TILE_N"]
    expected = paged_attention_reference(*args)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    bound = error_bound(args, kernel_rounds_p_to, tile_n, segments) + error_bound(args)
    excess = (actual.cpu().double() - expected.cpu().double()).abs() - bound
    assert not actual.isnan().any(), "NaN in the output: a read outside some sequence's context"
    worst = excess.flatten().argmax()
    assert excess.max() <= 0, f"off by more than the rounding bound: worst excess {excess.max():.3g} at flat index {worst}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("group", [1, 3, 4])
def test_mixed_batch_matches_the_reference(kernel, group, block_size, dtype):
    args = paged_batch(MIXED, group, 64, block_size, dtype, seed=group * 100 + block_size, device=DEVICE)
    assert_matches_reference(kernel(*args), args, dtype)


@pytest.mark.parametrize("seed", range(4))
def test_random_batches_match_the_reference(kernel, seed):
    rng = random.Random(seed)
    group, block_size, dtype = rng.choice([1, 3, 4]), rng.choice([16, 32]), rng.choice(DTYPES)
    head_dim = 128 if seed == 0 else 64
    args = paged_batch(random_specs(rng, rng.randint(1, 6), 300), group, head_dim, block_size, dtype, seed, device=DEVICE)
    assert_matches_reference(kernel(*args), args, dtype)


@pytest.mark.parametrize("group", [1, 3, 8])
def test_a_batch_of_decodes_only_matches_the_reference(kernel, group):
    """Every sequence has one query row: the launcher picks the small tile (16 rows)."""
    specs = [(1, length) for length in (1, 16, 17, 33, 150)]
    args = paged_batch(specs, group, 64, 16, torch.float32, seed=group, device=DEVICE)
    assert_matches_reference(kernel(*args), args, torch.float32)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_long_contexts_match_the_reference(kernel, dtype):
    """Contexts of a couple of thousand tokens (a decode, a late chunk) beside a whole prompt of
    several query tiles, in one batch; the interpreter's cost grows with query rows x keys, so the
    chunk and the prompt are only as long as it takes to cross many key blocks and tiles."""
    specs = [(1, 2500), (64, 2100), (384, 384)]
    args = paged_batch(specs, 4, 64, 16, dtype, seed=7, device=DEVICE)
    assert_matches_reference(kernel(*args), args, dtype)


@pytest.mark.parametrize("segments", [2, 3, 16])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_keys_split_into_runs_match_the_reference(kernel, dtype, segments):
    """Split keys (flash-decoding) on a mixed batch: runs that hold no key of a short context,
    prefill rows that see none of a run's keys, runs that start mid-block."""
    args = paged_batch(MIXED, 3, 64, 16, dtype, seed=segments, device=DEVICE)
    assert_matches_reference(kernel(*args, segments=segments), args, dtype, segments)


def test_runs_a_row_sees_nothing_of_do_not_set_its_merged_max(kernel):
    """Every score of every row near -200 (nats): the max of a run that a prefill row sees no key
    of must not count in the merge, where it would outweigh the runs the row does see so far
    that their weights underflow to 0 (NaN out)."""
    args = paged_batch(MIXED, 3, 64, 16, torch.float32, seed=5, device=DEVICE)
    q, k_cache = args[0], args[1]
    direction = torch.full((64,), 1 / 8, device=DEVICE)  # unit length
    k_cache.copy_(torch.where(k_cache.isnan(), k_cache, direction))  # the slots no sequence owns stay NaN
    q.copy_(-1600 * direction.expand_as(q))  # q.k = -1600, scaled by 64 ** -0.5: -200
    assert_matches_reference(kernel(*args, segments=3), args, torch.float32, 3)


@pytest.mark.slow
def test_long_decodes_split_into_runs_match_the_reference(kernel):
    """What split keys are for: a few decodes of long contexts."""
    args = paged_batch([(1, 3000), (1, 1500), (1, 40)], 4, 64, 16, torch.float32, seed=11, device=DEVICE)
    assert_matches_reference(kernel(*args, segments=16), args, torch.float32, 16)


@pytest.mark.parametrize("programs, sms, segments", [(3, 132, 16), (60, 132, 2), (132, 132, 1), (200, 132, 1), (9, 108, 12)])
def test_keys_are_split_until_every_sm_has_a_program(kernel, programs, sms, segments):
    """A decode at batch 1 of a model with 3 KV heads on an H100 (132 SMs) takes the most runs;
    a grid that already covers the SMs takes one."""
    from engine.attention.triton_kernel import segments_for

    assert segments_for(programs, sms) == segments


def test_fewer_than_one_key_run_is_refused(kernel):
    with pytest.raises(ValueError, match="segments"):
        kernel(*valid_args(), segments=0)


def test_an_empty_batch_gives_an_empty_output(kernel):
    args = paged_batch([], 2, 64, 16, torch.float32, seed=0, device=DEVICE)
    assert kernel(*args).shape == (0, 2 * NUM_KV_HEADS, 64)


# --- the oracle itself, against dense attention on a contiguous layout


@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("n, length", [(1, 1), (1, 50), (30, 30), (17, 45)])
def test_the_reference_equals_dense_sdpa(group, n, length):
    """One sequence, paged over shuffled blocks, against scaled_dot_product_attention in float64
    on the contiguous K/V, one query row at a time over exactly the keys it may see (so no mask
    is shared with the reference): within the reference's own error_bound of the exact result."""
    args = paged_batch([(n, length)], group, 64, 16, torch.float32, seed=n * 1000 + length + group, device=DEVICE)
    q, k_cache, v_cache, block_tables, _, _, block_size, scale = args
    positions = torch.arange(length)
    slots = block_tables[0].cpu()[positions // block_size].long() * block_size + positions % block_size
    k = k_cache.cpu()[slots].double().transpose(0, 1)  # [kv heads, L, D], contiguous order
    v = v_cache.cpu()[slots].double().transpose(0, 1)
    dense = torch.stack([
        F.scaled_dot_product_attention(
            q.cpu()[i].double()[:, None, :], k[:, : length - n + i + 1], v[:, : length - n + i + 1],
            scale=scale, enable_gqa=True,
        )[:, 0]
        for i in range(n)
    ])  # [n, H, D]
    reference = paged_attention_reference(*args)
    excess = (reference.cpu().double() - dense).abs() - error_bound(args)
    assert excess.max() <= 0, f"worst excess {excess.max():.3g}"


# --- refusals


def valid_args(dtype=torch.float32):
    return paged_batch([(3, 5), (1, 9)], 2, 64, 16, dtype, seed=0, device=DEVICE)


@pytest.mark.parametrize("head_dim", [48, 8, 512])
def test_a_head_dim_the_kernel_cannot_tile_is_refused(kernel, head_dim):
    args = paged_batch([(3, 5)], 2, head_dim, 16, torch.float32, seed=0, device=DEVICE)
    with pytest.raises(ValueError, match="head_dim"):
        kernel(*args)


def edited(args, index, value):
    args = list(args)
    args[index] = value
    return args


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda a: edited(a, 0, a[0][..., :32]), "head_dim"),  # q's head_dim differs from the cache's
        (lambda a: edited(a, 2, a[2][:, :1]), "v_cache"),  # v's shape differs from k's
        (lambda a: edited(a, 0, a[0][:, :3]), "multiple"),  # 3 query heads over 2 kv heads
        (lambda a: edited(a, 0, a[0][0]), r"\[tokens"),  # q without its token axis
        (lambda a: edited(a, 4, a[4][:-1]), "query_start"),
        (lambda a: edited(a, 5, a[5][:1]), "seq_lens"),
        (lambda a: edited(a, 3, a[3].long()), "int32"),
        (lambda a: edited(a, 1, a[1].half()), "dtype"),
        (lambda a: edited(a, 6, 0), "block_size"),
    ],
)
def test_mismatched_arguments_are_refused(kernel, edit, match):
    with pytest.raises(ValueError, match=match):
        kernel(*edit(valid_args()))


@pytest.mark.skipif(DEVICE == "cuda", reason="the CPU refusals")
def test_cpu_tensors_without_the_interpreter_are_refused(kernel, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        kernel(*valid_args())


@pytest.mark.skipif(DEVICE == "cuda", reason="the CPU refusals")
def test_bfloat16_is_refused_by_the_interpreter(kernel):
    with pytest.raises(ValueError, match="bfloat16"):
        kernel(*valid_args(torch.bfloat16))
