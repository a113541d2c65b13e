"""Whether torch multiplies bfloat16 at speed on this CPU: through oneDNN, which needs AVX512-BW/VL/DQ
or AVX-NE-CONVERT (or AMX). On an AVX2-only CPU it refuses, and torch emulates a bf16 matmul, ~25x
slower than float32 on a 200-row prefill here; the engine's own kernels and its quantised weights'
dequantised matmul then run in float32 instead."""

import functools

import torch


@functools.cache
def onednn_packs_bf16() -> bool:
    """Whether this torch's oneDNN computes in bf16 here (and can pack bf16 weights)."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
