"""Which adapter slot each token of a step uses, grouped by slot for the delta computation."""

from dataclasses import dataclass

import torch

from engine.lora.adapter import BASE_SLOT

KERNEL_BLOCK_ROWS = 16  # token rows per Triton program; every row of a program uses the same slot


@dataclass
class LoRABatch:
    groups: list[tuple[int, torch.Tensor]]  # (slot, its token rows) for every slot in the step
    # the same rows cut into blocks of at most KERNEL_BLOCK_ROWS, for the Triton kernels:
    rows: torch.Tensor  # [R] int32, the rows of every group back to back
    block_slot: torch.Tensor  # [B] int32
    block_start: torch.Tensor  # [B] int32, first index into `rows`
    block_rows: torch.Tensor  # [B] int32, rows in the block


def build_lora_batch(token_slots: list[int], device) -> LoRABatch | None:
    """From each token's slot (BASE_SLOT for the base model); None when no token uses an adapter:
    the forward pass then skips LoRA entirely."""
    by_slot: dict[int, list[int]] = {}
    for row, slot in enumerate(token_slots):
        if slot != BASE_SLOT:
            by_slot.setdefault(slot, []).append(row)
    if not by_slot:
        return None
    rows, block_slot, block_start, block_rows = [], [], [], []
    for slot in sorted(by_slot):
        for start in range(0, len(by_slot[slot]), KERNEL_BLOCK_ROWS):
            block_slot.append(slot)
            block_start.append(len(rows) + start)
            block_rows.append(min(KERNEL_BLOCK_ROWS, len(by_slot[slot]) - start))
        rows += by_slot[slot]

    def ints(values, dtype=torch.int32):
        return torch.tensor(values, dtype=dtype).to(device)

    return LoRABatch(
        groups=[(slot, ints(by_slot[slot], torch.long)) for slot in sorted(by_slot)],
        rows=ints(rows),
        block_slot=ints(block_slot),
        block_start=ints(block_start),
        block_rows=ints(block_rows),
    )
