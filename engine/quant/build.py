"""A weight of the model as the spec's width for its layer type asks (bf16 ones stay
engine/model/linear.py's Weight, which the model builds itself)."""

import torch

from common.quant_spec import LayerQuant
from engine.quant.int4_weight import Int4Weight
from engine.quant.int8_embedding import Int8Embedding
from engine.quant.int8_weight import Int8Weight


def quantized_projection(weight: torch.Tensor, layer: LayerQuant):
    """A callable `(x, bias) -> x @ weight.T + bias` holding `weight` at `layer`'s width (int8 or
    int4): on CUDA the Triton dequantising matmul, on a CPU torch's weight-only kernels."""
    if weight.device.type == "cuda":
        from engine.quant.triton_weight import TritonQuantWeight  # decorated on import: only when used

        return TritonQuantWeight(weight, layer)
    return Int8Weight(weight) if layer.width == "int8" else Int4Weight(weight, layer.group)


def embedding(weight: torch.Tensor, layer: LayerQuant):
    """Indexable by token ids, giving rows in weight's dtype: the tensor itself, or its int8 form."""
    return Int8Embedding(weight) if layer.width == "int8" else weight
