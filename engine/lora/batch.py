"""Which adapter slot each token of a step uses."""

from dataclasses import dataclass

import torch

BASE_SLOT = -1  # tokens of requests for the base model


@dataclass
class LoRABatch:
    slot_ids: torch.Tensor  # [T] int32, each token's slot or BASE_SLOT
    groups: list[tuple[int, torch.Tensor]]  # (slot, its token rows) for every slot in the step


def build_lora_batch(token_slots: list[int], device) -> LoRABatch | None:
    """None when every token is for the base model: the forward pass then skips LoRA entirely."""
    slots = sorted({s for s in token_slots if s != BASE_SLOT})
    if not slots:
        return None
    slot_ids = torch.tensor(token_slots, dtype=torch.int32)
    groups = [(slot, torch.nonzero(slot_ids == slot).flatten().to(device)) for slot in slots]
    return LoRABatch(slot_ids=slot_ids.to(device), groups=groups)
