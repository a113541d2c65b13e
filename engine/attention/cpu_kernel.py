"""The CPU paged-attention kernel (engine/kernels/csrc/paged_attention_cpu.cpp, built by
engine/kernels/cpu_build.py). One call attends a whole step (the varlen layout of
engine/runner/forward_batch.py, as the Triton kernel reads it): each K/V row read in place, where the
torch path gathers every decode's and later slice's blocks per layer and runs SDPA per first
slice (engine/attention/backend.py chooses it once)."""

import torch

from engine.kernels.cpu_build import cpu_kernel


def paged_attention_cpu(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                        query_start: torch.Tensor, seq_lens: torch.Tensor, block_size: int, scale: float, amx: bool = True) -> torch.Tensor:
    """[tokens, heads, head_dim]: sequence s's query rows query_start[s]:query_start[s + 1], the
    last of them at position seq_lens[s] - 1, each attending causally to its sequence's cached
    tokens (theirs included: write K/V first). k_cache, v_cache: [kv_heads, slots, head_dim];
    block_tables [S, blocks], query_start [S + 1] and seq_lens [S] int32 (the reference's
    contract, engine/attention/torch_reference.py, with the caches heads first). Raises
    RuntimeError on malformed arguments, or when the kernel is unavailable (cpu_kernel() says).
    amx=False keeps bf16 prefill tiles on AVX512-BF16 where the CPU has AMX (for tests and benchmarks)."""
    kernel = cpu_kernel()
    if kernel is None:
        raise RuntimeError("the CPU attention kernel could not be built")
    return kernel.paged_attention(q.contiguous(), k_cache, v_cache, block_tables.contiguous(), query_start.contiguous(),
                                  seq_lens.contiguous(), block_size, scale, amx)
