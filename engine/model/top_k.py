"""The indices of each row's k largest logits, in no particular order (the rows the bf16 head's
refinement recomputes in fp32, engine/model/llama.py). On a CPU a C++ pass (engine/kernels/csrc/top_k_cpu.cpp)
that skips the blocks that cannot hold one: torch.topk took a third as long as the head's
matmul itself on a 49,152-token vocabulary; elsewhere torch.topk."""

import torch

from engine.kernels.cpu_build import cpu_kernel

MAX_K = 64  # the C++ pass keeps the best k of a row in a fixed array


def top_k_indices(values: torch.Tensor, k: int) -> torch.Tensor:
    """values [rows, width]: int64 [rows, k], each row's k largest in any order."""
    kernel = cpu_kernel() if values.device.type == "cpu" and k <= MAX_K else None
    if kernel is not None:
        return kernel.top_k_indices(values.contiguous(), k)
    return values.topk(k, dim=-1).indices
