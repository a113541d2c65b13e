"""Random paged-attention batches and the rounding bound an implementation must meet on them,
shared by the tests of the Triton kernel and of the CPU decode kernel (both against
engine.attention.torch_reference)."""

import math
import random

import torch

NUM_KV_HEADS = 2


def paged_batch(specs, group, head_dim, block_size, dtype, seed, device="cpu"):
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
    return [t.to(device) for t in tensors] + [block_size, head_dim**-0.5]


def error_bound(args, rounds_p_to: torch.dtype | None = None, tile_n: int | None = None, segments: int = 1) -> torch.Tensor:
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
    covered by rounds_p_to=None, tile_n=None: one tile. Keys split into `segments` runs (the
    Triton kernel's split keys) start a tile in each run and rescale each run once more when
    the runs are merged, which adds one term a run to the sums: counted as 2 tiles a run."""
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
        tiles = (torch.ceil(keys / tile_n) if tile_n else torch.ones_like(keys)) + 2 * (segments - 1)
        delta = gamma(head_dim) * dot_abs + 6 * u * score_abs + 2 * u * (tiles + 1)
        relative = 2 * torch.expm1(delta) + u_p + gamma(2 * keys + 2 * tiles + 1)
        tiny = torch.finfo(torch.float32).tiny + tiny_p
        bound[begin:end] = relative * weighted_abs + tiny * abs_sum + u_out * out.abs()
    return bound


# (n query rows, L tokens in context): a decode at context 1, a prefill slice whose context starts
# mid-block and crosses block boundaries (21 cached), a whole prompt, a decode, a sequence with
# no query rows this step, a later chunk (chunked prefill) over many blocks
MIXED = [(1, 1), (40, 61), (45, 45), (1, 37), (0, 12), (70, 170), (1, 200)]


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
