"""Which kernel a quantised projection runs for a given number of rows (tokens in the step).

torch's weight-only kernels (int8: one scale per row; int4: packed, group-wise) dequantise as
they multiply: at a decode step's few rows they read 2-4x fewer bytes than bf16 and win, but
their cost grows with the rows about as fast as the rows, so at a prefill's hundreds of rows
they are 2-3x slower than the bf16 matmul. From DEQUANTIZE_FROM rows on, a projection
dequantises its weight into a bf16 scratch copy (one layer's, dropped after the call) and runs
the bf16 matmul. The thresholds are where the two measured about equal on SmolLM2's four
projection shapes on this project's 2-core CPU (AVX512-BF16; int8 64-128 rows, int4 128-256).
On a CPU where torch would emulate the bf16 matmul (AVX2 only), the dequantised copy is float32
and the result is rounded to bf16, as the engine's own AVX2 projection does from 128 rows."""

import torch

from engine.base.cpu_bf16 import onednn_packs_bf16

DEQUANTIZE_FROM = {"int8": 96, "int4": 192}


def dequantize_first(rows: int, width: str) -> bool:
    """True: dequantise the weight and run the bf16 matmul; False: the weight-only kernel."""
    return rows >= DEQUANTIZE_FROM[width]


def dequantized_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a dequantised weight is multiplied in, for activations of `dtype` on a CPU."""
    return torch.float32 if dtype == torch.bfloat16 and not onednn_packs_bf16() else dtype
