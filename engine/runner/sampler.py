"""Next-token choice for a whole batch on the device: greedy rows by one argmax; the other
rows by temperature, top-k and top-p as batched tensor ops, then one draw each from its own
generator, so that a seeded request is reproducible whatever it is batched with. Only the
chosen ids (and the logprobs a request asked for) cross to the host."""

import torch

from engine.core.sampling_params import SampledToken, SamplingParams


def make_generator(seed: int | None, device="cpu") -> torch.Generator:
    generator = torch.Generator(device=device)
    generator.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, ()).item()))
    return generator


def filtered_probabilities(logits: torch.Tensor, params: list[SamplingParams]) -> tuple[torch.Tensor, torch.Tensor]:
    """For rows [R, vocab] of logits and one params each: the probabilities after temperature,
    top-k and top-p, in each row's descending order of logits, and that order ([R, vocab] each).

    Top-p drops a token once the tokens before it already reach top_p; the best one always stays."""
    device, vocab = logits.device, logits.shape[-1]
    temperature = torch.tensor([p.temperature for p in params], device=device).unsqueeze(1)
    sorted_logits, order = (logits / temperature).sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=device)
    top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=device).unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(rank >= top_k, float("-inf"))
    # top_p >= 1 keeps everything: compare against infinity rather than trust a cumulative sum to stay below 1
    top_p = torch.tensor([p.top_p if p.top_p < 1.0 else float("inf") for p in params], device=device).unsqueeze(1)
    probs = sorted_logits.softmax(-1)
    sorted_logits = sorted_logits.masked_fill(probs.cumsum(-1) - probs >= top_p, float("-inf"))
    return sorted_logits.softmax(-1), order


def _draw(probs: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """One index per row, distributed as that row's probabilities: argmax of p / E with E
    exponential noise from the row's own generator (the exponential race)."""
    noise = torch.empty_like(probs)
    for row, generator in enumerate(generators):
        noise[row].exponential_(generator=generator)
    return (probs / noise).argmax(-1)


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]) -> list[SampledToken]:
    """logits: [S, vocab] float32 on the engine's device; one params and generator per row."""
    chosen = logits.argmax(-1)
    random_rows = [row for row, p in enumerate(params) if not p.greedy]
    if random_rows:
        index = torch.tensor(random_rows, device=logits.device)
        probs, order = filtered_probabilities(logits.index_select(0, index), [params[r] for r in random_rows])
        picked = _draw(probs, [generators[r] for r in random_rows])
        chosen = chosen.index_copy(0, index, order.gather(1, picked.unsqueeze(1)).squeeze(1))
    token_ids = chosen.tolist()
    sampled = [SampledToken(token) for token in token_ids]
    for row, p in enumerate(params):
        if p.logprobs is not None:
            sampled[row] = _with_logprobs(logits[row], token_ids[row], p.logprobs)
    return sampled


def _with_logprobs(logits: torch.Tensor, token: int, top_n: int) -> SampledToken:
    logprobs = logits.log_softmax(-1)
    top = ()
    if top_n:
        best = torch.topk(logprobs, top_n)
        top = tuple(zip(best.indices.tolist(), best.values.tolist()))
    return SampledToken(token, float(logprobs[token]), top)
