"""Turns a scheduled batch into the flat tensors one forward pass needs.

Tokens of all sequences are laid out back to back: sequence s owns query rows
query_start[s]:query_start[s + 1], at positions seq_lens[s] - n_s .. seq_lens[s] - 1. Index
building is numpy over the whole batch (no Python call per token), and the block tables
come from rows kept across steps (engine.block_tables), so host work per step grows with
the number of sequences and of new tokens, not with context length.

The CUDA and CPU kernels read the varlen layout itself. The torch attention path (a CPU
where the kernel could not be built) reads its plan from the batch, built on first use:
prefill slices one by one, and the single-token queries (decodes) in groups of similar
context length."""

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from engine.block_tables import BlockTables
from engine.lora.batch import BASE_SLOT, LoRABatch, build_lora_batch
from engine.sequence import Sequence


@dataclass
class PrefillSlice:
    start: int  # first query row
    length: int  # query tokens in this slice
    seq_len: int  # context after this step: positions [seq_len - length, seq_len) are the slice's
    blocks: torch.Tensor  # [blocks covering seq_len] block ids


@dataclass
class DecodeGroup:
    """Single-token queries of similar context length, attended together."""

    rows: torch.Tensor  # [B] query rows
    blocks: torch.Tensor  # [B, nb] block ids, nb covering the longest context (short rows padded with block 0)
    seq_lens: torch.Tensor  # [B] context length of each


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    slot_mapping: torch.Tensor  # [T] KV slot each new token is written to
    query_start: torch.Tensor  # [S + 1] int32
    seq_lens: torch.Tensor  # [S] int32
    block_tables: torch.Tensor  # [S, max blocks of the batch] int32
    logits_rows: torch.Tensor  # [R] rows whose output is sampled, in `sampled` order
    sampled: list[Sequence]  # sequences that get a new token from this step
    block_size: int  # tokens per KV block
    lora: LoRABatch | None = None  # each token's adapter slot; None when every token is for the base model

    # the torch attention path's plan (CPU tensors only), built on first use, once per step

    @cached_property
    def prefills(self) -> list[PrefillSlice]:
        """The prefill slices (more than one query row), one by one."""
        starts, seq_lens, tables = self.query_start.numpy(), self.seq_lens.numpy(), self.block_tables.numpy()
        return [
            PrefillSlice(int(starts[i]), int(starts[i + 1] - starts[i]), int(seq_lens[i]),
                         torch.from_numpy(tables[i, : -(-seq_lens[i] // self.block_size)].astype(np.int64)))
            for i in np.flatnonzero(np.diff(starts) > 1)
        ]

    @cached_property
    def decode_groups(self) -> list[DecodeGroup]:
        """The single-token queries (decodes) in groups of similar context length."""
        starts, seq_lens, tables = self.query_start.numpy(), self.seq_lens.numpy(), self.block_tables.numpy()
        groups = _similar_lengths(np.flatnonzero(np.diff(starts) == 1), seq_lens)
        return [
            DecodeGroup(torch.from_numpy(starts[g].astype(np.int64)),
                        torch.from_numpy(tables[g, : -(-seq_lens[g].max() // self.block_size)].astype(np.int64)),
                        torch.from_numpy(seq_lens[g]))
            for g in groups
        ]


# A decode group's shortest context is at least this fraction of its longest: padding every
# query to the longest context of the whole batch would gather and attend to up to 40x more
# KV than needed when contexts range from 32 to 1,280 tokens.
GROUP_LENGTH_RATIO = 0.75


@dataclass
class HostBatch:
    """A step's inputs as host arrays (see ForwardBatch), before they go to the device: eagerly
    (`to_device`) or into a captured decode graph's static inputs (engine/decode_graphs.py)."""

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


def _similar_lengths(indices: np.ndarray, seq_lens: np.ndarray) -> list[np.ndarray]:
    """`indices` cut into groups, longest context first, each group's shortest at least
    GROUP_LENGTH_RATIO of its longest."""
    ordered = indices[np.argsort(-seq_lens[indices], kind="stable")]
    groups, first = [], 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or seq_lens[ordered[i]] < GROUP_LENGTH_RATIO * seq_lens[ordered[first]]:
            groups.append(ordered[first:i])
            first = i
    return groups
