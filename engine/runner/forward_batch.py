"""Turns a scheduled batch into the flat tensors one forward pass needs.

Tokens of all sequences are laid out back to back: sequence s owns query rows
query_start[s]:query_start[s + 1], at positions seq_lens[s] - n_s .. seq_lens[s] - 1. Index
building is numpy over the whole batch (no Python call per token), and the block tables
come from rows kept across steps (engine/runner/block_tables.py), so host work per step grows with
the number of sequences and of new tokens, not with context length.

The batch the model reads is engine/attention/metadata.py's ForwardBatch."""

from dataclasses import dataclass

import numpy as np
import torch

from engine.attention.metadata import ForwardBatch
from engine.core.sequence import Sequence
from engine.lora.adapter import BASE_SLOT
from engine.lora.batch import build_lora_batch
from engine.runner.block_tables import BlockTables


@dataclass
class HostBatch:
    """A step's inputs as host arrays (see ForwardBatch), before they go to the device: eagerly
    (`to_device`) or into a captured decode graph's static inputs (engine/runner/decode_graphs.py)."""

    input_ids: np.ndarray  # [T] int64
    positions: np.ndarray  # [T] int64
    slot_mapping: np.ndarray  # [T] int64
    query_start: np.ndarray  # [S + 1] int32
    seq_lens: np.ndarray  # [S] int32
    block_tables: np.ndarray  # [S, max blocks of the batch] int32
    logits_rows: np.ndarray  # [R] int64
    sampled: list[Sequence]
    lora_slots: np.ndarray  # [T] each token's adapter slot

    @property
    def decodes_only(self) -> bool:
        """One new token for every sequence, each sampled: a decode step."""
        return len(self.sampled) == len(self.seq_lens) == len(self.input_ids)

    @property
    def uses_lora(self) -> bool:
        return bool((self.lora_slots != BASE_SLOT).any())


def host_batch(items: list[tuple[Sequence, int]], tables: BlockTables, block_size: int) -> HostBatch:
    input_ids: list[int] = []
    rows, starts, counts, lora_slots = [], [], [], []
    logits_rows, sampled = [], []
    for seq, n in items:
        start = seq.num_computed_tokens
        input_ids += seq.tokens(start, start + n)
        rows.append(tables.row_of(seq.request_id, seq.block_table))
        starts.append(start)
        counts.append(n)
        lora_slots.append(seq.lora_slot)
        if start + n == seq.num_tokens:
            logits_rows.append(len(input_ids) - 1)
            sampled.append(seq)
    counts_np, starts_np = np.array(counts), np.array(starts)
    query_start = np.zeros(len(items) + 1, dtype=np.int32)
    np.cumsum(counts_np, out=query_start[1:])
    seq_lens = (starts_np + counts_np).astype(np.int32)
    positions = np.arange(query_start[-1]) - np.repeat(query_start[:-1] - starts_np, counts_np)
    token_rows = np.repeat(rows, counts_np)
    slot_mapping = tables.table[token_rows, positions // block_size].astype(np.int64) * block_size + positions % block_size
    max_blocks = int(-(-seq_lens.max() // block_size))
    return HostBatch(
        input_ids=np.array(input_ids, dtype=np.int64), positions=positions.astype(np.int64), slot_mapping=slot_mapping,
        query_start=query_start, seq_lens=seq_lens, block_tables=tables.table[rows, :max_blocks],
        logits_rows=np.array(logits_rows, dtype=np.int64), sampled=sampled, lora_slots=np.repeat(lora_slots, counts_np),
    )


def to_device(host: HostBatch, block_size: int, device) -> ForwardBatch:
    pinned = torch.device(device).type == "cuda"

    def tensor(array) -> torch.Tensor:
        """On CUDA through pinned memory (torch's caching host allocator), so the copy is asynchronous."""
        t = torch.from_numpy(np.ascontiguousarray(array))
        return (t.pin_memory() if pinned else t).to(device, non_blocking=True)

    return ForwardBatch(
        input_ids=tensor(host.input_ids),
        positions=tensor(host.positions),
        slot_mapping=tensor(host.slot_mapping),
        query_start=tensor(host.query_start),
        seq_lens=tensor(host.seq_lens),
        block_tables=tensor(host.block_tables),
        logits_rows=tensor(host.logits_rows),
        sampled=host.sampled,
        block_size=block_size,
        lora=build_lora_batch(host.lora_slots.tolist(), device) if host.uses_lora else None,
    )


def build_forward_batch(items: list[tuple[Sequence, int]], tables: BlockTables, block_size: int, device) -> ForwardBatch:
    return to_device(host_batch(items, tables, block_size), block_size, device)
