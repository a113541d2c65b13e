"""The projections' matmul. On a CPU in bfloat16, weights are reordered once at load, so that
no step pays for reordering them again:
- where the CPU has AVX512-BF16 (and the CPU kernels built), into engine/kernels/csrc/linear_cpu.cpp's
  blocked layout ([N/16, K/2, 16, 2]: 16 output columns by pairs of inputs), which its kernel
  reads as one stream per 16 columns; faster than oneDNN's packed weights at every row count
  measured, most at one or two rows, where a decode step is bound by the weights' bytes.
  Where the CPU also has AMX and the inputs come in whole 32-wide tiles, linear_amx.cpp
  multiplies the same blocks as AMX tiles, at every row count (so a row's result does not depend
  on how many others share its step). The figures are on the benchmarks page of the docs;
- where the CPU has AVX2 but no AVX512-BF16, into the same blocked layout, for
  engine/kernels/csrc/linear_avx2.cpp (widened to float32 in registers; from 128 rows a float32 copy
  for the call and torch's GEMM);
- elsewhere, where oneDNN can pack bf16 (AVX512-BW/VL/DQ or AVX-NE-CONVERT), into oneDNN's
  blocked layout: 1.1-2.3x faster than F.linear on the same weights (batch 1 to 300 rows), with
  bit-identical results.
Everywhere else (CUDA, float32, a torch built without oneDNN) it is F.linear on the plain tensor."""

import torch
import torch.nn.functional as F

from engine.base.cpu_bf16 import onednn_packs_bf16
from engine.kernels.cpu_build import cpu_kernel

# the row count oneDNN tunes the packed layout for; any other count runs on it as well
PACKED_FOR_ROWS = 64
# the blocked layout's output columns per block and input elements per pair
BLOCK_COLUMNS, PAIR = 16, 2


def blocked_kernel(weight: torch.Tensor):
    """engine/kernels/csrc/linear_cpu.cpp's kernel when it can take `weight` ([out, in] bfloat16 on a
    CPU, out a multiple of 16, in of 2) and this machine built it (AVX512-BF16 or AVX2), else None."""
    out_features, in_features = weight.shape
    if weight.device.type != "cpu" or weight.dtype != torch.bfloat16 or out_features % BLOCK_COLUMNS or in_features % PAIR:
        return None
    kernel = cpu_kernel()
    return kernel.linear_bf16 if kernel is not None and kernel.has_bf16_linear() else None


def to_blocked(weight: torch.Tensor) -> torch.Tensor:
    """[out, in] -> [out/16, in/2, 16, 2]: for each 16 output columns, their weights a pair of
    inputs at a time."""
    out_features, in_features = weight.shape
    blocks = weight.reshape(out_features // BLOCK_COLUMNS, BLOCK_COLUMNS, in_features // PAIR, PAIR)
    return blocks.permute(0, 2, 1, 3).contiguous()


class Weight:
    """A [out, in] projection weight, reordered for the CPU's kernel where that pays."""

    def __init__(self, weight: torch.Tensor, keep_plain: bool = False):
        """`keep_plain`: keep the plain tensor beside a reordered copy (for a caller that reads rows of it)."""
        self.plain = weight
        self.packed = None  # the reordered copy, for `_kernel` (ours) or oneDNN
        self._kernel = blocked_kernel(weight)
        if self._kernel is not None:
            self.packed = to_blocked(weight)
        elif weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and onednn_packs_bf16():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACKED_FOR_ROWS)
        if self.packed is not None and not keep_plain:
            self.plain = None  # the reordered copy replaces it
        # what it holds: one copy, or two when the plain tensor is kept beside the reordered one
        copies = (self.packed is not None) + (self.plain is not None)
        self.nbytes = copies * weight.numel() * weight.element_size()
        self.read_bytes = weight.numel() * weight.element_size()  # what one call reads: one copy

    @property
    def layout(self) -> str:
        """What a call reads: "blocked" (this project's kernel), "onednn" or "plain"."""
        return "blocked" if self._kernel is not None else "onednn" if self.packed is not None else "plain"

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self._kernel is not None:
            return self._kernel(x, self.packed, bias)
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")
        return F.linear(x, self.plain, bias)
