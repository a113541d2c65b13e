"""What a forward pass reads about its batch: the flat varlen layout every attention
implementation reads (the CUDA and CPU kernels read it as it is), and the torch path's plan
built from it on first use: prefill slices one by one, and the single-token queries (decodes)
in groups of similar context length."""

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from engine.lora.batch import LoRABatch


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
    sampled: list  # the sequences (engine.core.sequence.Sequence) that get a new token from this step
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
