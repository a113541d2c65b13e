"""The CPU paged-attention kernel (engine/kernels/csrc/paged_attention_cpu.cpp) against the plain torch
reference: mixed batches of prefill slices (first and later, starting mid-block) and decodes,
contexts of 1 to a few thousand tokens, GQA ratios 1 to 16, head sizes the bf16 paths take
(multiples of 32) and ones they leave to the float32 path or the plain loops (48, and more
than 8 query heads per KV head), two block sizes, float32, bfloat16 and float16. Slots no sequence owns hold NaN, so a
read outside a context shows. The bound is the one the Triton kernel is held to
(tests/helpers/paged_attention_cases.py) for a kernel that makes one pass over the keys, with
its probabilities rounded to bf16 before p.v wherever it has AVX512-BF16 and bf16 caches."""

import logging
import random
import subprocess
import sys

import pytest
import torch

from engine.attention import cpu_kernel as paged_attention_cpu
from engine.attention.torch_reference import paged_attention_reference
from engine.kernels import cpu_build as cpu_kernels
from tests.helpers.paged_attention_cases import MIXED, error_bound, paged_batch, random_specs

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(scope="module")
def kernel():
    module = cpu_kernels.cpu_kernel()
    assert module is not None, "the CPU kernel did not build (see the warning logged)"
    return paged_attention_cpu.paged_attention_cpu


def run(kernel, args, amx=True):
    """The kernel on paged_batch's arguments (its caches are [slots, kv_heads, head_dim]; the
    engine's are heads first). amx=False: bf16 prefill tiles on AVX512-BF16 where AMX could run."""
    q, k_cache, v_cache, *tables_and_sizes = args
    return kernel(q, k_cache.transpose(0, 1).contiguous(), v_cache.transpose(0, 1).contiguous(), *tables_and_sizes, amx=amx)


def needs_amx(amx):
    """Skips the AMX case where the CPU (or the kernels' build) has none: it would rerun the other."""
    if amx and not cpu_kernels.cpu_kernel().amx_ready():
        pytest.skip("this CPU (or its kernel build) has no AMX")


def assert_matches_reference(actual, args, tile_n=None):
    """`tile_n`: the fewest keys in a part where rows may be split into parts (merged by rescales)."""
    expected = paged_attention_reference(*args)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert not actual.isnan().any(), "NaN in the output: a read outside some sequence's context"
    # each within its bound of the exact result; bf16 prefill tiles round p to bf16 before p.v
    rounds_p_to = torch.bfloat16 if actual.dtype == torch.bfloat16 else None
    bound = error_bound(args, rounds_p_to=rounds_p_to) + error_bound(args, tile_n=tile_n)
    excess = (actual.double() - expected.double()).abs() - bound
    assert excess.max() <= 0, f"off by more than the rounding bound: worst excess {excess.max():.3g}"


def decodes(lengths):
    return [(1, length) for length in lengths]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("group", [1, 3, 4, 8])
def test_decodes_match_the_reference(kernel, group, block_size, dtype):
    """Contexts at and around block boundaries and across the 16-position chunks of the bf16 path."""
    args = paged_batch(decodes([1, 15, 16, 17, 31, 33, 100, 257]), group, 64, block_size, dtype, seed=group * 10 + block_size)
    assert_matches_reference(run(kernel, args), args)


@pytest.mark.parametrize("head_dim", [32, 48, 96, 128, 256])
@pytest.mark.parametrize("group", [3, 6])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_other_head_sizes_match_the_reference(kernel, head_dim, group, dtype):
    """bf16 p.v takes 32 dims a pass, or 64 for up to 4 query heads: 96 mixes the two."""
    args = paged_batch(decodes([1, 40, 200]), group, head_dim, 16, dtype, seed=head_dim)
    assert_matches_reference(run(kernel, args), args)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_more_query_heads_per_kv_head_than_the_vector_paths_hold(kernel, dtype):
    args = paged_batch(decodes([5, 70]), 16, 64, 16, dtype, seed=16)
    assert_matches_reference(run(kernel, args), args)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("group", [1, 3, 4])
def test_a_mixed_batch_matches_the_reference(kernel, group, block_size, dtype):
    """Decodes, a whole prompt, later slices whose first row starts mid-block, a sequence with no
    rows this step."""
    args = paged_batch(MIXED, group, 64, block_size, dtype, seed=group * 100 + block_size)
    assert_matches_reference(run(kernel, args), args)
    if dtype == torch.bfloat16:  # its prefill slices as tiles on AVX512-BF16 too
        assert_matches_reference(run(kernel, args, amx=False), args)


@pytest.mark.parametrize("seed", range(6))
def test_random_batches_match_the_reference(kernel, seed):
    rng = random.Random(seed)
    group, block_size, dtype = rng.choice([1, 2, 3, 4, 8]), rng.choice([16, 32]), rng.choice(DTYPES)
    args = paged_batch(random_specs(rng, rng.randint(1, 8), 600), group, 64, block_size, dtype, seed)
    assert_matches_reference(run(kernel, args), args)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_long_contexts_match_the_reference(kernel, dtype):
    """A couple of thousand tokens: decodes, a late chunk and a whole prompt in one batch."""
    args = paged_batch([(1, 3000), (1, 2049), (200, 1800), (512, 512)], 3, 64, 16, dtype, seed=3)
    assert_matches_reference(run(kernel, args), args)
    if dtype == torch.bfloat16:
        assert_matches_reference(run(kernel, args, amx=False), args)


@pytest.mark.parametrize("amx", [True, False])
@pytest.mark.parametrize("head_dim", [32, 64, 128, 256])
@pytest.mark.parametrize("group", [1, 3, 16])
def test_bf16_prefill_tiles_match_the_reference_at_every_head_size(kernel, head_dim, group, amx):
    """The tiled bf16 path (head sizes that are multiples of 32, up to 256), on AMX (16-vector
    tiles, 1 to 4 tiles of output dims at once) and on AVX512-BF16, with a tile's last query
    vectors short of a full block of them, a slice that starts mid-block and one row short of a
    tile, and a decode beside them."""
    needs_amx(amx)
    args = paged_batch([(37, 37), (61, 301), (1, 50)], group, head_dim, 16, torch.bfloat16, seed=head_dim + group)
    assert_matches_reference(run(kernel, args, amx=amx), args)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [8, 48, 64, 72, 256])
@pytest.mark.parametrize("group", [1, 3, 16])
def test_prefill_slices_match_the_reference_at_every_head_size_in_every_dtype(kernel, head_dim, group, dtype):
    """Prefill slices in float32 (and in bf16 and fp16 where the CPU has no AVX512-BF16) attend
    as float32 tiles with AVX2: 4 query vectors by 16 keys for q.k, 3 vectors by 32 columns (then
    8) for p.v; head sizes of whole and partial 32-column chunks, a slice that starts mid-block,
    one of 17 keys (a key tile and one more), a first slice of 1 row, and a decode beside them."""
    args = paged_batch([(37, 37), (61, 301), (3, 17), (1, 1), (1, 50)], group, head_dim, 16, dtype, seed=head_dim + group)
    assert_matches_reference(run(kernel, args), args)


MIN_PART_POSITIONS = 128  # kMinPartPositions in engine/kernels/csrc/paged_attention_cpu.cpp


@pytest.mark.parametrize("threads", [2, 3, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("group", [1, 3])
def test_a_lone_decode_split_across_threads_matches_the_reference(kernel, group, dtype, threads):
    """One decode is one task per KV head (2 here): with 3 or 4 threads its positions are cut
    into parts of at least 128, merged after; contexts shorter than two parts, a part boundary
    mid-block and a few thousand positions."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for length in [200, 255, 256, 1000, 2049]:
            args = paged_batch(decodes([length]), group, 64, 16, dtype, seed=length + group)
            assert_matches_reference(run(kernel, args), args, tile_n=MIN_PART_POSITIONS)
    finally:
        torch.set_num_threads(before)


def test_an_empty_batch_gives_an_empty_output(kernel):
    args = paged_batch([], 3, 64, 16, torch.bfloat16, seed=0)
    assert run(kernel, args).shape == (0, 6, 64)


def test_the_tables_must_be_int32(kernel):
    args = paged_batch(decodes([5]), 1, 64, 16, torch.float32, seed=0)
    args[3] = args[3].long()
    with pytest.raises(RuntimeError, match="int32"):
        run(kernel, args)


def test_query_starts_that_do_not_cover_q_are_refused(kernel):
    args = paged_batch([(3, 5), (1, 9)], 1, 64, 16, torch.float32, seed=0)
    args[4] = torch.tensor([0, 3, 3], dtype=torch.int32)  # the last row belongs to no sequence
    with pytest.raises(RuntimeError, match="query_start"):
        run(kernel, args)


def test_a_context_longer_than_its_block_table_is_refused(kernel):
    args = paged_batch(decodes([5]), 1, 64, 16, torch.float32, seed=0)
    args[5] = torch.tensor([10_000], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="block table"):
        run(kernel, args)


def test_a_query_head_count_that_is_not_a_multiple_of_the_kv_heads_is_refused(kernel):
    args = paged_batch(decodes([5]), 1, 64, 16, torch.float32, seed=0)
    args[0] = torch.cat([args[0], args[0][:, :1]], dim=1)  # 3 query heads over 2 KV heads
    with pytest.raises(RuntimeError, match="GQA"):
        run(kernel, args)


def test_a_lock_left_by_a_process_killed_mid_build_does_not_stop_the_next_build():
    """torch waits as long as its lock file exists; one left behind would hang every later
    build on this machine (seen after a build was killed)."""
    variant = cpu_kernels.best_variant(cpu_kernels.cpu_flags())
    (cpu_kernels.build_directory(variant) / "lock").touch()
    script = f"from engine.kernels.cpu_build import build; build({variant!r})"
    started = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert started.returncode == 0, started.stderr
    assert not (cpu_kernels.build_directory(variant) / "lock").exists()


def test_every_variant_is_built_ahead_whatever_this_cpu_runs():
    """`make` compiles every instruction set's kernels with its own flags, so each path is at least
    compiled on every build machine."""
    missing = [v for v in cpu_kernels.VARIANTS if cpu_kernels._built_library(cpu_kernels.build_directory(v)) is None]
    assert missing == [], f"not built: {missing} (make builds them: python -m engine.kernels.cpu_build)"


@pytest.mark.parametrize("variant", list(cpu_kernels.VARIANTS))
def test_each_variant_this_cpu_runs_matches_the_reference(variant):
    missing = cpu_kernels.VARIANTS[variant][1] - cpu_kernels.cpu_flags()
    if missing:
        pytest.skip(f"the {variant} kernels cannot run on this CPU (it lacks {', '.join(sorted(missing))}); "
                    "they run where the CPU has them")
    module = cpu_kernels.load_variant(variant)
    assert module is not None, f"the {variant} kernels are not built"
    assert module.has_bf16_linear() == (variant != "generic")

    def attend(q, k, v, tables, starts, lens, block_size, scale, amx=True):
        return module.paged_attention(q.contiguous(), k, v, tables.contiguous(), starts.contiguous(), lens.contiguous(),
                                      block_size, scale, amx)

    for dtype in DTYPES:
        args = paged_batch(MIXED, 4, 64, 16, dtype, seed=0)
        assert_matches_reference(run(attend, args), args)


def test_without_a_build_or_a_compiler_the_engine_keeps_the_torch_path(monkeypatch, caplog, tmp_path):
    import torch.utils.cpp_extension

    def no_compiler(**_):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setenv("K25_CPU_KERNELS_DIR", str(tmp_path))  # where nothing was built ahead
    monkeypatch.setattr(torch.utils.cpp_extension, "_write_ninja_file_and_build_library", no_compiler)
    cpu_kernels.cpu_kernel.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="engine.kernels.cpu_build"):
            assert cpu_kernels.cpu_kernel() is None
        assert "not built ahead" in caplog.text and "using the torch paths" in caplog.text
        assert "no C++ compiler found" in caplog.text
        with pytest.raises(RuntimeError, match="could not be built"):
            paged_attention_cpu.paged_attention_cpu(*([None] * 6), 16, 1.0)
    finally:
        cpu_kernels.cpu_kernel.cache_clear()
