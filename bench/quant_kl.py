"""What quantisation costs in accuracy: the model's next-token distributions, teacher-forced
through the engine's own forward pass and paged KV cache, against the unquantised model's."""

import math
from dataclasses import dataclass

import torch

from engine.attention.kv_cache import KVCache
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence
from engine.model.llama import LlamaModel
from engine.runner.block_tables import BlockTables
from engine.runner.forward_batch import build_forward_batch

BLOCK_SIZE = 16
SLICE_TOKENS = 64  # fed a slice at a time, every position's logits kept


def teacher_forced_logprobs(model: LlamaModel, tokens: list[int], slice_tokens: int = SLICE_TOKENS) -> torch.Tensor:
    """Log-softmax [len(tokens), vocab] (fp32) of the next token at every position of `tokens`."""
    blocks = -(-len(tokens) // BLOCK_SIZE)
    kv = KVCache(model.config, blocks * BLOCK_SIZE, "cpu", model.dtype)
    seq = Sequence("teacher-forced", tokens, SamplingParams(max_tokens=1), block_table=list(range(blocks)))
    tables = BlockTables(1, blocks)
    out = []
    with torch.inference_mode():
        for start in range(0, len(tokens), slice_tokens):
            size = min(slice_tokens, len(tokens) - start)
            batch = build_forward_batch([(seq, size)], tables, BLOCK_SIZE, "cpu")
            batch.logits_rows = torch.arange(size)
            out.append(model.forward(batch, kv).float().log_softmax(-1))
            seq.num_computed_tokens += size
    return torch.cat(out)


@dataclass(frozen=True)
class Divergence:
    positions: int
    mean_kl: float  # nats/token, KL(reference || candidate)
    perplexity: float  # of the texts' own next tokens under the candidate
    top1_agreement: float  # share of positions whose most likely token is the reference's


def divergence(references: list[torch.Tensor], candidates: list[torch.Tensor], texts: list[list[int]]) -> Divergence:
    """Pooled over texts; position i predicts token i + 1, so the last position has no target."""
    kl = nll = agree = positions = targets = 0.0
    for ref, cand, tokens in zip(references, candidates, texts):
        kl += float((ref.exp() * (ref - cand)).sum(-1).sum())
        agree += int((ref.argmax(-1) == cand.argmax(-1)).sum())
        positions += len(tokens)
        nll -= float(cand[:-1].gather(1, torch.tensor(tokens[1:]).unsqueeze(1)).sum())
        targets += len(tokens) - 1
    return Divergence(int(positions), kl / positions, math.exp(nll / targets), agree / positions)
