"""The Triton paged-attention kernel against the torch reference on random paged batches
(mixed prefill slices and decodes, chunks starting mid-block, GQA, two block sizes), the
reference itself against dense scaled_dot_product_attention, and the launcher's refusals.
On a CPU the kernel runs under TRITON_INTERPRET=1 (float32 and float16 only: the
interpreter's bfloat16 tl.dot is wrong); on CUDA bfloat16 is checked too."""

import math
import random

import pytest
import torch
import torch.nn.functional as F

from engine.paged_attention_reference import paged_attention_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])
NUM_KV_HEADS = 2


@pytest.fixture(autouse=True)
def interpret_on_a_cpu(monkeypatch):
    """Triton reads it when the kernel is decorated (its module's first import) and while it runs."""
    if DEVICE == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def kernel(interpret_on_a_cpu):
    from engine.paged_attention_triton import paged_attention_triton

    return paged_attention_triton


def paged_batch(specs, group, head_dim, block_size, dtype, seed):
    """Arguments for one step of len(specs) sequences; specs[s] = (n_s query rows, L_s tokens in
    context). Each sequence's blocks are scattered over the cache in random order (block 0 is
    one of them, and also every table row's padding); the slots no sequence owns hold NaN, so a
    read outside a sequence's context shows in the output."""
    generator = torch.Generator().manual_seed(seed)
    blocks_of = [math.ceil(length / block_size) for _, length in specs]
    num_blocks = sum(blocks_of) + 2
    order = torch.randperm(num_blocks, generator=generator)
    order = torch.cat([torch.zeros(1, dtype=order.dtype), order[order != 0]])  # the first sequence gets block 0
    k_cache = torch.full((num_blocks * block_size, NUM_KV_HEADS, head_dim), float("nan"))
    v_cache = k_cache.clone()
    block_tables = torch.zeros(len(specs), max(blocks_of, default=0) + 1, dtype=torch.int32)
    used = 0
    for s, ((_, length), count) in enumerate(zip(specs, blocks_of)):
        ids = order[used : used + count]
        used += count
        block_tables[s, :count] = ids.int()
        positions = torch.arange(length)
        slots = ids[positions // block_size] * block_size + positions % block_size
        k_cache[slots] = torch.randn(length, NUM_KV_HEADS, head_dim, generator=generator)
        v_cache[slots] = torch.randn(length, NUM_KV_HEADS, head_dim, generator=generator)
    rows = [n for n, _ in specs]
    query_start = torch.tensor([0] + [sum(rows[: s + 1]) for s in range(len(rows))], dtype=torch.int32)
    q = torch.randn(sum(rows), NUM_KV_HEADS * group, head_dim, generator=generator)
    seq_lens = torch.tensor([length for _, length in specs], dtype=torch.int32)
    tensors = (q.to(dtype), k_cache.to(dtype), v_cache.to(dtype), block_tables, query_start, seq_lens)
    return [t.to(DEVICE) for t in tensors] + [block_size, head_dim**-0.5]


def error_bound(args, rounds_p_to: torch.dtype | None = None, tile_n: int | None = None) -> torch.Tensor:
    """How far one float32-accumulating evaluation of the batch may be from the exact attention
    of the same (already rounded) inputs, per output element, to first order in the unit
    roundoff: a worst case (errors all of one sign), not a statistical estimate. u is float32's
    eps, twice its unit roundoff, so that accumulators that truncate (tensor cores) are covered
    too; gamma(n) = n u / (1 - n u) bounds a sum of n terms (Higham, Accuracy and Stability,
    3.1). For query row i with L visible keys, head h, over the keys j it sees:
      - each score s_j = scale q.k_j is off by at most gamma(D) max_j scale |q|.|k_j|; scaling by
        scale*log2(e) and subtracting the running max add 2u max_j |s_j| each; exp2 about 2u;
        the rescales by exp2(old max - new max), one per key tile (`tiles`, tile_n keys each),
        2u each plus u times their arguments, which telescope to at most 2 max_j |s_j|. With
        delta the sum, each p_j = exp(s_j - max) has relative error <= expm1(delta) and each
        weight p_j / sum(p) twice that.
      - sum(p) and sum(p v) over L terms, their rescales and the final division:
        gamma(2L + 2 tiles + 1) relative.
      - the kernel rounds p to V's dtype before p.v (FlashAttention does): that dtype's unit
        roundoff u_p relative, or an absolute tiny * u_p where p is subnormal there; exp2 may
        flush float32 results below float32's tiny to zero.
    A relative error e on every weight moves o = sum w_j v_j by at most e * W, W = sum w_j |v_j|;
    an absolute error a on every p_j by at most a * sum |v_j| / sum(p). Casting o to the output
    dtype adds its unit roundoff times |o|. The reference (no p rounding, no key tiles) is
    covered by rounds_p_to=None, tile_n=None: one tile."""
    q, k_cache, v_cache, block_tables, query_start, seq_lens, block_size, scale = args
    u = torch.finfo(torch.float32).eps
    gamma = lambda n: n * u / (1 - n * u)  # noqa: E731
    u_out = torch.finfo(q.dtype).eps / 2 if q.dtype != torch.float32 else 0.0
    u_p = torch.finfo(rounds_p_to).eps / 2 if rounds_p_to not in (None, torch.float32) else 0.0
    tiny_p = torch.finfo(rounds_p_to).tiny * u_p if u_p else 0.0
    head_dim = q.shape[2]
    group = q.shape[1] // k_cache.shape[1]
    bound = torch.zeros(q.shape, dtype=torch.float64)
    starts, lens = query_start.tolist(), seq_lens.tolist()
    for s, length in enumerate(lens):
        begin, end = starts[s], starts[s + 1]
        n = end - begin
        if n == 0:
            continue
        positions = torch.arange(length)
        slots = block_tables[s].cpu()[positions // block_size].long() * block_size + positions % block_size
        k = k_cache.cpu()[slots].double().repeat_interleave(group, dim=1)  # [L, H, D]
        v = v_cache.cpu()[slots].double().repeat_interleave(group, dim=1)
        qs = q[begin:end].cpu().double()  # [n, H, D]
        visible = positions[None, :] <= torch.arange(length - n, length)[:, None]  # [n, L]
        scores = torch.einsum("nhd,lhd->hnl", qs, k) * scale
        p = torch.exp(scores - scores.masked_fill(~visible, -math.inf).amax(-1, keepdim=True)) * visible
        total = p.sum(-1, keepdim=True)  # [H, n, 1]
        weighted_abs = torch.einsum("hnl,lhd->nhd", p / total, v.abs())  # W
        abs_sum = torch.einsum("hnl,lhd->nhd", visible.double().expand_as(p) / total, v.abs())
        out = torch.einsum("hnl,lhd->nhd", p / total, v)

        def visible_max(x):  # [H, n, L] -> [n, H, 1], over the keys each row sees
            return x.masked_fill(~visible, 0).amax(-1).T[:, :, None]

        dot_abs = visible_max(torch.einsum("nhd,lhd->hnl", qs.abs(), k.abs()) * scale)
        score_abs = visible_max(scores.abs())
        keys = (positions[length - n :] + 1).double()[:, None, None]  # L per row
        tiles = torch.ceil(keys / tile_n) if tile_n else torch.ones_like(keys)
        delta = gamma(head_dim) * dot_abs + 6 * u * score_abs + 2 * u * (tiles + 1)
        relative = 2 * torch.expm1(delta) + u_p + gamma(2 * keys + 2 * tiles + 1)
        tiny = torch.finfo(torch.float32).tiny + tiny_p
        bound[begin:end] = relative * weighted_abs + tiny * abs_sum + u_out * out.abs()
    return bound


def assert_matches_reference(actual, args, kernel_rounds_p_to):
    """Both are within their error_bound of the exact result, so of each other within the sum."""
    from engine.paged_attention_triton import TILE_N  # imported by the `kernel` fixture, under the interpreter on a CPU

    expected = paged_attention_reference(*args)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    bound = error_bound(args, kernel_rounds_p_to, TILE_N) + error_bound(args)
    excess = (actual.cpu().double() - expected.cpu().double()).abs() - bound
    assert not actual.isnan().any(), "NaN in the output: a read outside some sequence's context"
    worst = excess.flatten().argmax()
    assert excess.max() <= 0, f"off by more than the rounding bound: worst excess {excess.max():.3g} at flat index {worst}"


# (n query rows, L tokens in context): a decode at context 1, a prefill slice whose context starts
# mid-block and crosses block boundaries (21 cached), a whole prompt, a decode, a sequence with
# no query rows this step, a later chunk (chunked prefill) over many blocks
MIXED = [(1, 1), (40, 61), (45, 45), (1, 37), (0, 12), (70, 170), (1, 200)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("group", [1, 3, 4])
def test_mixed_batch_matches_the_reference(kernel, group, block_size, dtype):
    args = paged_batch(MIXED, group, 64, block_size, dtype, seed=group * 100 + block_size)
    assert_matches_reference(kernel(*args), args, dtype)


def random_specs(rng: random.Random, count: int, max_context: int):
    specs = []
    for _ in range(count):
        kind = rng.choice(["decode", "prompt", "chunk"])
        if kind == "decode":
            specs.append((1, rng.randint(1, max_context)))
        elif kind == "prompt":
            n = rng.randint(1, max_context // 2)
            specs.append((n, n))
        else:
            cached, n = rng.randint(1, max_context // 2), rng.randint(2, max_context // 2)
            specs.append((n, cached + n))
    return specs


@pytest.mark.parametrize("seed", range(4))
def test_random_batches_match_the_reference(kernel, seed):
    rng = random.Random(seed)
    group, block_size, dtype = rng.choice([1, 3, 4]), rng.choice([16, 32]), rng.choice(DTYPES)
    head_dim = 128 if seed == 0 else 64
    args = paged_batch(random_specs(rng, rng.randint(1, 6), 300), group, head_dim, block_size, dtype, seed)
    assert_matches_reference(kernel(*args), args, dtype)


@pytest.mark.parametrize("group", [1, 3, 8])
def test_a_batch_of_decodes_only_matches_the_reference(kernel, group):
    """Every sequence has one query row: the launcher picks the small tile (16 rows)."""
    specs = [(1, length) for length in (1, 16, 17, 33, 150)]
    args = paged_batch(specs, group, 64, 16, torch.float32, seed=group)
    assert_matches_reference(kernel(*args), args, torch.float32)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_long_contexts_match_the_reference(kernel, dtype):
    """A couple of thousand tokens: a whole prompt, a decode and a late chunk in one batch."""
    specs = [(1, 2500), (200, 2100), (1024, 1024)]
    args = paged_batch(specs, 4, 64, 16, dtype, seed=7)
    assert_matches_reference(kernel(*args), args, dtype)


def test_an_empty_batch_gives_an_empty_output(kernel):
    args = paged_batch([], 2, 64, 16, torch.float32, seed=0)
    assert kernel(*args).shape == (0, 2 * NUM_KV_HEADS, 64)


# --- the oracle itself, against dense attention on a contiguous layout


@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("n, length", [(1, 1), (1, 50), (30, 30), (17, 45)])
def test_the_reference_equals_dense_sdpa(group, n, length):
    """One sequence, paged over shuffled blocks, against scaled_dot_product_attention in float64
    on the contiguous K/V, one query row at a time over exactly the keys it may see (so no mask
    is shared with the reference): within the reference's own error_bound of the exact result."""
    args = paged_batch([(n, length)], group, 64, 16, torch.float32, seed=n * 1000 + length + group)
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
    return paged_batch([(3, 5), (1, 9)], 2, 64, 16, dtype, seed=0)


@pytest.mark.parametrize("head_dim", [48, 8, 512])
def test_a_head_dim_the_kernel_cannot_tile_is_refused(kernel, head_dim):
    args = paged_batch([(3, 5)], 2, head_dim, 16, torch.float32, seed=0)
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
