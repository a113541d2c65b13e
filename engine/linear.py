"""The projections' matmul. On a CPU in bfloat16, weights are reordered once at load into
oneDNN's blocked layout, so that no step pays for reordering them again: 1.1-2.3x faster
than F.linear on the same weights here (batch 1 to 300 rows, SmolLM2's shapes), with
bit-identical results. Everywhere else (CUDA, float32, a torch built without oneDNN) it is
F.linear on the plain tensor."""

import torch
import torch.nn.functional as F

# the row count oneDNN tunes the packed layout for; any other count runs on it as well
PACKED_FOR_ROWS = 64


class Weight:
    """A [out, in] projection weight, packed for oneDNN where that pays."""

    def __init__(self, weight: torch.Tensor, keep_plain: bool = False):
        """`keep_plain`: keep the plain tensor beside a packed copy (for a caller that reads rows of it)."""
        self.plain = weight
        self.packed = None
        if weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and torch.backends.mkldnn.is_available():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACKED_FOR_ROWS)
            if not keep_plain:
                self.plain = None  # the packed copy replaces it
        # what it holds: one copy, or two when the plain tensor is kept beside the packed one
        copies = (self.packed is not None) + (self.plain is not None)
        self.nbytes = copies * weight.numel() * weight.element_size()
        self.read_bytes = weight.numel() * weight.element_size()  # what one call reads: one copy

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")
        return F.linear(x, self.plain, bias)
