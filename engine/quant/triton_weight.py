"""A quantised projection weight for CUDA, run by the Triton dequantising matmul
(engine/quant/triton_matmul.py). Same quantisation as the CPU kinds (engine/quant/quantize.py);
int4 codes are packed two to a byte along the input dim."""

import torch

from common.quant_spec import LayerQuant
from engine.quant.quantize import dequantize_int4_groups, dequantize_int8_rows, quantize_int4_groups, quantize_int8_rows
from engine.quant.triton_matmul import dequant_matmul


class TritonQuantWeight:
    plain = None  # no bf16 rows kept

    def __init__(self, weight: torch.Tensor, layer: LayerQuant):
        self.width = layer.width
        self.shape = tuple(weight.shape)
        if layer.width == "int8":
            self.bits, self.group = 8, weight.shape[1]
            self.codes, scale = quantize_int8_rows(weight)
            self.scale, self.zero = scale[:, None].contiguous(), None
        else:
            self.bits, self.group = 4, layer.group
            codes, self.scale, self.zero = quantize_int4_groups(weight, layer.group)
            self.codes = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()
        self.nbytes = sum(t.nbytes for t in (self.codes, self.scale, self.zero) if t is not None)
        self.read_bytes = self.nbytes  # what one call reads

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """[N, K] in `dtype` (for checks; the matmul dequantises tile by tile)."""
        if self.bits == 8:
            return dequantize_int8_rows(self.codes, self.scale[:, 0], dtype)
        codes = torch.stack([self.codes & 15, self.codes >> 4], dim=-1).view(self.shape)
        return dequantize_int4_groups(codes, self.scale, self.zero, dtype)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        out = dequant_matmul(rows, self.codes, self.scale, self.zero, self.bits, self.group)
        out = out.view(*x.shape[:-1], out.shape[-1])
        return out if bias is None else out + bias
