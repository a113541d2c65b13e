"""Attention over the paged KV cache: one interface, chosen once when the model is built, so that
no layer asks again. Each backend attends a whole step per layer, reading K/V in place through
the block tables:
- `triton` on CUDA (engine/attention/triton_kernel.py);
- `cpu-kernel` on a CPU where the C++ kernels built (engine/attention/cpu_kernel.py);
- `torch` on a CPU where they did not (engine/attention/torch_path.py).
engine/attention/torch_reference.py is the plain oracle all three are tested against."""

from typing import Protocol

import torch

from engine.attention.metadata import ForwardBatch
from engine.kernels.cpu_build import cpu_kernel


class AttentionBackend(Protocol):
    name: str

    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: ForwardBatch,
                scale: float) -> torch.Tensor:
        """q [T, heads, head_dim]; k_cache, v_cache [kv_heads, slots, head_dim] of one layer, the
        step's new K/V already written (engine/model/layer_ops.py) -> [T, heads, head_dim]."""


class TritonAttention:
    name = "triton"

    def __init__(self):
        from engine.attention.triton_kernel import paged_attention_triton  # imports triton: CUDA only

        self._kernel = paged_attention_triton

    def forward(self, q, k_cache, v_cache, batch: ForwardBatch, scale: float) -> torch.Tensor:
        return self._kernel(q, k_cache.transpose(0, 1), v_cache.transpose(0, 1), batch.block_tables,
                            batch.query_start, batch.seq_lens, batch.block_size, scale)


class CpuKernelAttention:
    name = "cpu-kernel"

    def forward(self, q, k_cache, v_cache, batch: ForwardBatch, scale: float) -> torch.Tensor:
        from engine.attention.cpu_kernel import paged_attention_cpu

        return paged_attention_cpu(q, k_cache, v_cache, batch.block_tables, batch.query_start, batch.seq_lens,
                                   batch.block_size, scale)


def choose_attention_backend(device) -> AttentionBackend:
    from engine.attention.torch_path import TorchAttention

    if torch.device(device).type == "cuda":
        return TritonAttention()
    return CpuKernelAttention() if cpu_kernel() is not None else TorchAttention()
