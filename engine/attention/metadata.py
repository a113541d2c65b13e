"""What a forward pass reads about its batch: the flat varlen layout every attention backend
reads (the CUDA and CPU kernels as it is; the torch path builds its plan from it)."""

from dataclasses import dataclass

import torch

from engine.lora.batch import LoRABatch


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
