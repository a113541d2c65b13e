"""The token embedding in int8, one scale per row: a step gathers a few rows and dequantises them."""

import torch

from engine.quant.quantize import quantize_int8_rows


class Int8Embedding:
    width = "int8"

    def __init__(self, weight: torch.Tensor):
        self.codes, self.scale = quantize_int8_rows(weight)
        self.dtype = weight.dtype
        self.nbytes = self.codes.nbytes + self.scale.nbytes
        self.row_bytes = self.codes.shape[1] * self.codes.element_size() + self.scale.element_size()

    def __getitem__(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` in the weight's dtype."""
        return self.codes[ids] * self.scale[ids].unsqueeze(-1)
