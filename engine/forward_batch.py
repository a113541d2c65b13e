"""Turns a scheduled batch into the flat tensors one forward pass needs.

Tokens of all sequences are laid out back to back. Single-token queries (decodes) are
attended in padded groups of similar context length; multi-token prefill slices one by one."""

from dataclasses import dataclass

import torch

from engine.lora.batch import LoRABatch, build_lora_batch
from engine.sequence import Sequence


@dataclass
class PrefillSegment:
    start: int  # first row in the flat token layout
    length: int  # query tokens in this prefill slice
    context_slots: torch.Tensor | None  # KV slots of positions [0, end); None when the slice is the whole context
    mask: torch.Tensor | None  # [length, end] True where query i may see key j; None: plain causal


@dataclass
class DecodeGroup:
    """Single-token queries of similar context length, attended together in one padded batch."""

    rows: torch.Tensor  # [B] rows of the flat token layout
    context_slots: torch.Tensor  # [B, L] KV rows each query attends to (padded with its last slot)
    mask: torch.Tensor  # [B, 1, 1, L] True where a key is real


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    slot_mapping: torch.Tensor  # [T] KV row each new token is written to
    decode_groups: list[DecodeGroup]
    prefills: list[PrefillSegment]
    logits_rows: torch.Tensor  # [S] rows whose output is sampled, in `sampled` order
    sampled: list[Sequence]  # sequences that get a new token from this step
    lora: LoRABatch | None = None  # each token's adapter slot; None when every token is for the base model


def _slots(block_table: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    return block_table[positions // block_size] * block_size + positions % block_size


def build_forward_batch(items: list[tuple[Sequence, int]], block_size: int, device) -> ForwardBatch:
    input_ids, positions, slot_mapping = [], [], []
    decode_rows, decode_tables, decode_lengths = [], [], []
    prefills, logits_rows, sampled = [], [], []
    token_slots = []
    row = 0
    for seq, n in items:
        start_pos, end_pos = seq.num_computed_tokens, seq.num_computed_tokens + n
        table = torch.tensor(seq.block_table, dtype=torch.long)
        seq_positions = torch.arange(start_pos, end_pos)
        input_ids.extend(seq.token_at(p) for p in range(start_pos, end_pos))
        token_slots.extend([seq.lora_slot] * n)
        positions.append(seq_positions)
        slot_mapping.append(_slots(table, seq_positions, block_size))
        if n == 1:
            decode_rows.append(row)
            decode_tables.append(table)
            decode_lengths.append(end_pos)
        else:
            if start_pos == 0:
                prefills.append(PrefillSegment(start=row, length=n, context_slots=None, mask=None))
            else:
                context = _slots(table, torch.arange(end_pos), block_size).to(device)
                mask = torch.arange(end_pos)[None, :] <= seq_positions[:, None]
                prefills.append(PrefillSegment(start=row, length=n, context_slots=context, mask=mask.to(device)))
        if end_pos == seq.num_tokens:
            logits_rows.append(row + n - 1)
            sampled.append(seq)
        row += n

    decode_groups = [
        _decode_group(group, block_size, device)
        for group in _similar_lengths(list(zip(decode_rows, decode_tables, decode_lengths)))
    ]

    return ForwardBatch(
        input_ids=torch.tensor(input_ids, dtype=torch.long, device=device),
        positions=torch.cat(positions).to(device),
        slot_mapping=torch.cat(slot_mapping).to(device),
        decode_groups=decode_groups,
        prefills=prefills,
        logits_rows=torch.tensor(logits_rows, dtype=torch.long, device=device),
        sampled=sampled,
        lora=build_lora_batch(token_slots, device),
    )


# A decode group's shortest context is at least this fraction of its longest: padding every
# query to the longest context of the whole batch would gather and attend to up to 40x more
# KV than needed when contexts range from 32 to 1,280 tokens.
GROUP_LENGTH_RATIO = 0.75


def _similar_lengths(decodes: list[tuple[int, torch.Tensor, int]]) -> list[list[tuple[int, torch.Tensor, int]]]:
    groups: list[list[tuple[int, torch.Tensor, int]]] = []
    for entry in sorted(decodes, key=lambda d: d[2], reverse=True):
        if groups and entry[2] >= GROUP_LENGTH_RATIO * groups[-1][0][2]:
            groups[-1].append(entry)
        else:
            groups.append([entry])
    return groups


def _decode_group(group: list[tuple[int, torch.Tensor, int]], block_size: int, device) -> DecodeGroup:
    rows = [row for row, _, _ in group]
    lengths = torch.tensor([length for _, _, length in group])
    key_positions = torch.arange(int(lengths.max()))
    slots = torch.stack([_slots(table, key_positions.clamp(max=length - 1), block_size) for _, table, length in group])
    mask = key_positions[None, :] < lengths[:, None]
    return DecodeGroup(
        rows=torch.tensor(rows, dtype=torch.long, device=device),
        context_slots=slots.to(device),
        mask=mask[:, None, None, :].to(device),
    )
