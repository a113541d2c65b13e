"""`k25 bench gpu`, section attention: the Triton paged-attention kernel
(engine/attention/triton_kernel.py) against torch's scaled_dot_product_attention in float64 on
the same inputs laid out contiguously, per case the largest absolute difference and the rounding
bound the oracle allows an implementation in that dtype (engine/attention/torch_reference.py).

Off CUDA the kernel runs only under TRITON_INTERPRET=1, which must be set before triton is first
imported (the caller runs this section in a process of its own with it set); the interpreter
multiplies bfloat16 wrongly, so a bfloat16 case is recorded as skipped there."""

import math
from itertools import accumulate

import torch
import torch.nn.functional as F

from engine.attention.torch_reference import rounding_bound


def paged(k: list[torch.Tensor], v: list[torch.Tensor], block_size: int, generator: torch.Generator):
    """Each sequence's K and V [L, kv_heads, head_dim] written into one cache over blocks in a
    shuffled order: (k_cache, v_cache, block_tables [S, max_blocks] int32)."""
    blocks_of = [math.ceil(len(keys) / block_size) for keys in k]
    order = torch.randperm(sum(blocks_of), generator=generator)
    k_cache = torch.zeros(sum(blocks_of) * block_size, *k[0].shape[1:], dtype=k[0].dtype)
    v_cache = torch.zeros_like(k_cache)
    block_tables = torch.zeros(len(k), max(blocks_of), dtype=torch.int32)
    used = 0
    for s, (keys, values) in enumerate(zip(k, v)):
        ids = order[used : used + blocks_of[s]]
        used += blocks_of[s]
        block_tables[s, : len(ids)] = ids.int()
        positions = torch.arange(len(keys))
        slots = ids[positions // block_size] * block_size + positions % block_size
        k_cache[slots], v_cache[slots] = keys, values
    return k_cache, v_cache, block_tables


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """One sequence's attention with torch's SDPA in float64: q [n, heads, D] at the last n of the
    L positions of k, v [L, kv_heads, D], each row seeing the keys up to its own position."""
    n, length = q.shape[0], k.shape[0]
    visible = torch.arange(length, device=q.device)[None, :] <= torch.arange(length - n, length, device=q.device)[:, None]
    out = F.scaled_dot_product_attention(q.double().transpose(0, 1), k.double().transpose(0, 1), v.double().transpose(0, 1),
                                         attn_mask=visible, scale=scale, enable_gqa=True)
    return out.transpose(0, 1)


def run_case(specs: list[list[int]], dtype: str, heads: int, kv_heads: int, head_dim: int, block_size: int,
             device: str, seed: int) -> dict:
    """The kernel on one step of len(specs) sequences, specs[s] = (query rows, context tokens), against SDPA."""
    from engine.attention.triton_kernel import paged_attention_triton  # imports triton: after TRITON_INTERPRET is set

    generator = torch.Generator().manual_seed(seed)
    torch_dtype = getattr(torch, dtype)

    def randn(*shape) -> torch.Tensor:  # rounded to the dtype: both sides see the same inputs
        return torch.randn(*shape, generator=generator).to(torch_dtype)

    q = [randn(n, heads, head_dim) for n, _ in specs]
    k = [randn(length, kv_heads, head_dim) for _, length in specs]
    v = [randn(length, kv_heads, head_dim) for _, length in specs]
    k_cache, v_cache, block_tables = paged(k, v, block_size, generator)
    query_start = torch.tensor([0, *accumulate(n for n, _ in specs)], dtype=torch.int32)
    seq_lens = torch.tensor([length for _, length in specs], dtype=torch.int32)
    scale = head_dim**-0.5
    ours = paged_attention_triton(*(t.to(device) for t in (torch.cat(q), k_cache, v_cache, block_tables, query_start, seq_lens)),
                                  block_size, scale)
    q, k, v = ([t.to(device) for t in ts] for ts in (q, k, v))
    exact = torch.cat([dense_attention(qs, ks, vs, scale) for qs, ks, vs in zip(q, k, v)])
    max_score = max(float((qs.double() @ ks.double().flatten(0, 1).T).abs().max()) * scale for qs, ks in zip(q, k))
    bound = rounding_bound(torch_dtype, head_dim, int(seq_lens.max()), max_score, float(torch.cat(v).abs().max()))
    error = float((ours.double() - exact).abs().max())
    return {"max_abs_error": error, "bound": bound, "within_bound": error <= bound, "nan": bool(ours.isnan().any())}


def attention_check(cases: list[dict], device: str, seed: int = 0) -> dict:
    """Each case: {"name", "specs", "dtype", "heads", "kv_heads", "head_dim", "block_size"}."""
    results = []
    for i, case in enumerate(cases):
        shape = {"name": case["name"], "dtype": case["dtype"], "sequences": len(case["specs"]),
                 "query_rows": sum(n for n, _ in case["specs"]), "longest_context": max(length for _, length in case["specs"])}
        if device != "cuda" and case["dtype"] == "bfloat16":
            results.append({**shape, "skipped": "the Triton interpreter multiplies bfloat16 wrongly: CUDA only"})
            continue
        params = {key: case[key] for key in ("specs", "dtype", "heads", "kv_heads", "head_dim", "block_size")}
        results.append({**shape, **run_case(**params, device=device, seed=seed + i)})
    checked = [r for r in results if "skipped" not in r]
    return {"interpreted": device != "cuda", "cases": results,
            "all_within_bound": bool(checked) and all(r["within_bound"] and not r["nan"] for r in checked)}
