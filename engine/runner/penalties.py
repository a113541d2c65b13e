"""Penalties and biases on a batch's logits before sampling, vectorised over the rows that
ask for them: the repetition penalty (as transformers and vLLM apply it: a seen token's
positive logit divided by it, a negative one multiplied) over the prompt's and the answer's
tokens; OpenAI's presence and frequency penalties over the answer's tokens
(logit - frequency x count - presence x [count > 0]); and `logit_bias` added per token."""

import torch

from engine.core.sampling_params import SamplingParams


def apply_penalties(logits: torch.Tensor, params: list[SamplingParams], prompts: list[list[int]],
                    answers: list[list[int]]) -> None:
    """In place on `logits` [R, vocab]; one params, prompt and answer so far per row."""
    rows = [row for row, p in enumerate(params) if p.penalised]
    if not rows:
        return
    device, vocab = logits.device, logits.shape[1]
    index = torch.tensor(rows, device=device)
    picked = logits.index_select(0, index)
    counts = _counts([answers[r] for r in rows], vocab, device)
    seen = (_counts([prompts[r] for r in rows], vocab, device) + counts) > 0
    repetition = _column([params[r].repetition_penalty for r in rows], device)
    picked = torch.where(seen, torch.where(picked > 0, picked / repetition, picked * repetition), picked)
    picked = picked - _column([params[r].frequency_penalty for r in rows], device) * counts
    picked = picked - _column([params[r].presence_penalty for r in rows], device) * (counts > 0)
    for i, row in enumerate(rows):
        if params[row].logit_bias:
            ids, biases = zip(*params[row].logit_bias)
            picked[i, list(ids)] += torch.tensor(biases, device=device, dtype=picked.dtype)
    logits.index_copy_(0, index, picked)


def _counts(token_lists: list[list[int]], vocab: int, device) -> torch.Tensor:
    """[len(token_lists), vocab]: how often each token occurs in each list."""
    counts = torch.zeros(len(token_lists), vocab, device=device)
    for i, tokens in enumerate(token_lists):
        if tokens:
            ids = torch.tensor(tokens, device=device)
            counts[i].index_add_(0, ids, torch.ones(len(tokens), device=device))
    return counts


def _column(values: list[float], device) -> torch.Tensor:
    return torch.tensor(values, device=device).unsqueeze(1)
