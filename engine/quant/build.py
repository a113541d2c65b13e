"""A weight of the model as the spec's width for its layer type asks."""

import torch

from common.quant_spec import LayerQuant
from engine.linear import Weight
from engine.quant.int4_weight import Int4Weight
from engine.quant.int8_embedding import Int8Embedding
from engine.quant.int8_weight import Int8Weight


def projection(weight: torch.Tensor, layer: LayerQuant, keep_plain: bool = False):
    """A callable `(x, bias) -> x @ weight.T + bias` holding `weight` at `layer`'s width: on CUDA
    the Triton dequantising matmul, on a CPU torch's weight-only kernels."""
    if layer.quantized and weight.device.type == "cuda":
        from engine.quant.triton_weight import TritonQuantWeight  # decorated on import: only when used

        return TritonQuantWeight(weight, layer)
    if layer.width == "int8":
        return Int8Weight(weight)
    if layer.width == "int4":
        return Int4Weight(weight, layer.group)
    return Weight(weight, keep_plain)


def embedding(weight: torch.Tensor, layer: LayerQuant):
    """Indexable by token ids, giving rows in weight's dtype: the tensor itself, or its int8 form."""
    return Int8Embedding(weight) if layer.width == "int8" else weight
