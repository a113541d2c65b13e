"""Whether torch multiplies bfloat16 at speed on this CPU: through oneDNN, which needs AVX512-BW/VL/DQ
or AVX-NE-CONVERT (or AMX). On an AVX2-only CPU it refuses and torch emulates the bf16 matmul
(SmolLM2's int4 prefill through it took 22x the time of float32 here), so the engine's AVX2
projection widens bf16 to float32 and the quantised weights' dequantised matmul runs in float32."""

import functools

import torch


@functools.cache
def onednn_packs_bf16() -> bool:
    """Whether this torch's oneDNN computes in bf16 here (and can pack bf16 weights)."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
