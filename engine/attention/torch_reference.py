"""Paged attention in plain torch, written for clarity: the oracle that the Triton kernel
(engine/attention/triton_kernel.py) and the engine's CPU path (engine/attention/backend.py) are tested
against.

One step's query tokens of S sequences sit back to back in q; sequence s owns rows
query_start[s]:query_start[s+1] (n_s of them) and has seq_lens[s] tokens in context after
this step, its new ones included (their K/V are already in the cache). Its query row i sits
at position seq_lens[s] - n_s + i and attends to key positions 0..that position. Key
position p of sequence s lives in cache slot block_tables[s, p // block_size] * block_size
+ p % block_size. GQA: query head h reads kv head h // (num_heads // num_kv_heads).

Per sequence this gathers its slots and builds its causal mask (so it syncs with the device
and its work grows with context length); softmax in float32 (or float64 for float64 inputs).
`rounding_bound` says how far an implementation in a lower precision may be from the exact result."""

import torch


def check_paged_attention_args(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
) -> None:
    """The shape checks both implementations make (no device values read); ValueError on a mismatch."""
    if q.dim() != 3 or k_cache.dim() != 3:
        raise ValueError(
            f"q must be [tokens, num_heads, head_dim] and k_cache [num_slots, num_kv_heads, head_dim]; "
            f"got q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}"
        )
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache {tuple(v_cache.shape)} must have k_cache's shape {tuple(k_cache.shape)}")
    if q.shape[2] != k_cache.shape[2]:
        raise ValueError(f"q's head_dim {q.shape[2]} differs from the cache's {k_cache.shape[2]}")
    num_heads, num_kv_heads = q.shape[1], k_cache.shape[1]
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if block_tables.dim() != 2:
        raise ValueError(f"block_tables must be [num_seqs, max_blocks]; got {tuple(block_tables.shape)}")
    num_seqs = block_tables.shape[0]
    if tuple(query_start.shape) != (num_seqs + 1,):
        raise ValueError(f"query_start must be [num_seqs + 1] = [{num_seqs + 1}]; got {tuple(query_start.shape)}")
    if tuple(seq_lens.shape) != (num_seqs,):
        raise ValueError(f"seq_lens must be [num_seqs] = [{num_seqs}]; got {tuple(seq_lens.shape)}")
    if not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int; got {block_size!r}")


def paged_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    scale: float,
) -> torch.Tensor:
    """q [T, num_heads, head_dim] -> [T, num_heads, head_dim] in q's dtype; rows owned by no
    sequence (from query_start[-1] on) are zero."""
    check_paged_attention_args(q, k_cache, v_cache, block_tables, query_start, seq_lens, block_size)
    compute = torch.promote_types(q.dtype, torch.float32)
    group = q.shape[1] // k_cache.shape[1]
    out = torch.zeros_like(q)
    starts, lens = query_start.tolist(), seq_lens.tolist()
    for s, length in enumerate(lens):
        begin, end = starts[s], starts[s + 1]
        n = end - begin
        if n == 0:
            continue
        if not 0 < n <= length:
            raise ValueError(f"sequence {s}: {n} query rows but {length} tokens in context")
        positions = torch.arange(length, device=q.device)
        slots = block_tables[s, positions // block_size].long() * block_size + positions % block_size
        k = k_cache[slots].to(compute).repeat_interleave(group, dim=1)  # [L, num_heads, head_dim]
        v = v_cache[slots].to(compute).repeat_interleave(group, dim=1)
        scores = torch.einsum("nhd,lhd->hnl", q[begin:end].to(compute), k) * scale
        query_positions = torch.arange(length - n, length, device=q.device)
        visible = positions[None, :] <= query_positions[:, None]  # [n, L]
        probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        out[begin:end] = torch.einsum("hnl,lhd->nhd", probs, v).to(q.dtype)
    return out


def rounding_bound(dtype: torch.dtype, head_dim: int, context: int, max_abs_score: float, max_abs_v: float) -> float:
    """How far an implementation computing in `dtype` with float32 accumulation may be from the
    exact attention of the same inputs, in absolute terms over a whole batch, from the dtype's
    unit roundoff u. float32: the scores and the p.v sums each carry at most ~(terms) * u relative
    error (terms = head_dim, then the context), so (head_dim + context) * u * max|v|. 16-bit: the
    scores or the probabilities rounded to the dtype (a score s off by |s| * u moves its weight by
    that much relatively; a probability off by u moves the output by at most u * max|v|), twice,
    plus the output's own rounding: (2 max|s| + 3) * u * max|v|."""
    u = torch.finfo(dtype).eps / 2
    if dtype == torch.float32:
        return (head_dim + context) * u * max_abs_v
    return (2 * max_abs_score + 3) * u * max_abs_v
