"""The device tensors that hold the adapters in use, and the delta they add to a projection.

Per layer and fused projection: A stacked as [slots, slices, max_rank, in_features] and B as
[slots, out_features, max_rank], adapters of lower rank zero-padded (the padded rows add
nothing) and the LoRA scaling folded into B when a slot is written. A step's tokens may
use different slots; each projection adds x @ A[slot].T @ B[slot].T to every token of a
slot, slice by slice. The torch path does one pair of matmuls per slot present in the
step; the Triton path (engine/lora/kernels.py) one shrink and one expand launch for all
tokens of all slots at once."""

import torch

from engine.base.model_config import ModelConfig
from engine.lora.adapter import AdapterWeights
from engine.lora.batch import LoRABatch
from engine.lora.layout import projections

KERNELS = ("torch", "triton")


class LoRASlots:
    def __init__(self, config: ModelConfig, num_slots: int, max_rank: int, device, dtype: torch.dtype, kernel: str = "torch"):
        self.num_slots = num_slots
        self.max_rank = max_rank
        self.projections = {p.name: p for p in projections(config)}
        self._module_slice = {m: (p, i) for p in self.projections.values() for i, m in enumerate(p.modules)}

        def stacks(shape) -> list[dict[str, torch.Tensor]]:
            """Per layer, per projection, a zeroed tensor of shape(projection)."""
            return [
                {p.name: torch.zeros(shape(p), device=device, dtype=dtype) for p in self.projections.values()}
                for _ in range(config.num_layers)
            ]

        self.a = stacks(lambda p: (num_slots, len(p.slice_sizes), max_rank, p.in_features))
        self.b = stacks(lambda p: (num_slots, p.out_features, max_rank))
        self.nbytes = sum(t.numel() * t.element_size() for layer in self.a + self.b for t in layer.values())
        self._add = self._add_torch
        if kernel == "triton":
            from engine.lora.kernels import lora_expand_, lora_shrink  # decorated on import: only when used

            self._shrink, self._expand = lora_shrink, lora_expand_
            self._offsets = {p.name: torch.tensor(p.slice_offsets, dtype=torch.int32, device=device) for p in self.projections.values()}
            self._add = self._add_triton

    def write(self, slot: int, weights: AdapterWeights) -> None:
        """Put an adapter into `slot`, replacing whatever was there."""
        for layer_a, layer_b in zip(self.a, self.b):
            for name in self.projections:
                layer_a[name][slot].zero_()
                layer_b[name][slot].zero_()
        rank = weights.rank
        for (layer, module), (a, b) in weights.matrices.items():
            projection, index = self._module_slice[module]
            start, end = projection.slice_offsets[index], projection.slice_offsets[index + 1]
            self.a[layer][projection.name][slot, index, :rank].copy_(a)
            self.b[layer][projection.name][slot, start:end, :rank].copy_(b.float() * weights.scaling)

    def add_delta(self, layer: int, projection: str, x: torch.Tensor, out: torch.Tensor, batch: LoRABatch) -> None:
        """out[t] += the LoRA delta of token t's slot, for the fused `projection` of `layer`."""
        self._add(self.a[layer][projection], self.b[layer][projection], self.projections[projection], x, out, batch)

    def _add_torch(self, a, b, projection, x, out, batch: LoRABatch) -> None:
        slices = len(projection.slice_sizes)
        offsets = projection.slice_offsets
        for slot, rows in batch.groups:
            shrunk = x.index_select(0, rows) @ a[slot].flatten(0, 1).T  # [tokens, slices * rank]
            parts = shrunk.split(self.max_rank, dim=1)
            delta = torch.cat([parts[i] @ b[slot, offsets[i] : offsets[i + 1]].T for i in range(slices)], dim=1)
            out.index_add_(0, rows, delta)

    def _add_triton(self, a, b, projection, x, out, batch: LoRABatch) -> None:
        shrunk = self._shrink(x, a, batch)
        self._expand(out, shrunk, b, self._offsets[projection.name], max(projection.slice_sizes), batch)
