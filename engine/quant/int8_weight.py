"""An [out, in] projection weight in int8, one bf16 scale per output row, run by torch's
weight-only int8 kernel (`aten._weight_int8pack_mm`: bf16 activations, int8 weights read as
they are stored)."""

import torch
import torch.nn.functional as F

from engine.quant.kernel_choice import dequantize_first, dequantized_dtype
from engine.quant.quantize import dequantize_int8_rows, quantize_int8_rows


class Int8Weight:
    width = "int8"
    plain = None  # no bf16 rows kept

    def __init__(self, weight: torch.Tensor):
        self.codes, self.scale = quantize_int8_rows(weight)
        self.nbytes = self.codes.nbytes + self.scale.nbytes
        self.read_bytes = self.nbytes  # what one call reads

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """[N, K] in `dtype`; one pass (int8 codes times bf16 scales promote to bf16)."""
        return dequantize_int8_rows(self.codes, self.scale, dtype)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        if dequantize_first(rows.shape[0], self.width):
            dtype = dequantized_dtype(x.dtype)
            out = F.linear(rows.to(dtype), self.dequantized(dtype)).to(x.dtype)
        else:
            out = torch.ops.aten._weight_int8pack_mm(rows, self.codes, self.scale)
        out = out.view(*x.shape[:-1], out.shape[-1])
        return out if bias is None else out + bias
