"""Next-token choice per sequence: greedy, or temperature with top-k / top-p, from a
per-request generator so that a seeded request is reproducible whatever it is batched with."""

from dataclasses import dataclass

import torch

from engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class SampledToken:
    token_id: int
    logprob: float | None = None  # of the chosen token, when logprobs were asked for
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), best first


def make_generator(seed: int | None) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, ()).item()))
    return generator


def _filtered_probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    scaled = logits / params.temperature
    if 0 < params.top_k < scaled.numel():
        kth_best = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth_best, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = scaled.sort(descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # drop a token once the tokens before it already reach top_p; the best one always stays
        drop_sorted = (cumulative - sorted_logits.softmax(-1)) >= params.top_p
        scaled = scaled.scatter(0, order[drop_sorted], float("-inf"))
    return scaled.softmax(-1)


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]) -> list[SampledToken]:
    """logits: [S, vocab] float32 on any device; one params and generator per row."""
    logits = logits.cpu()
    greedy_choice = logits.argmax(-1).tolist()
    sampled = []
    for row, (p, generator) in enumerate(zip(params, generators)):
        if p.greedy:
            token = greedy_choice[row]
        else:
            token = int(torch.multinomial(_filtered_probabilities(logits[row], p), 1, generator=generator).item())
        if p.logprobs is None:
            sampled.append(SampledToken(token))
            continue
        logprobs = logits[row].log_softmax(-1)
        best = torch.topk(logprobs, p.logprobs) if p.logprobs else None
        top = tuple(zip(best.indices.tolist(), best.values.tolist())) if best is not None else ()
        sampled.append(SampledToken(token, float(logprobs[token]), top))
    return sampled
