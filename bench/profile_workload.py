"""The workload of `k25 bench profile`: requests whose prompt and output fill a number of
chunks drawn from a length distribution, arriving at once or as a Poisson process, from a seed."""

import random
from dataclasses import dataclass

from bench.engine_bench import random_prompt

# named length distributions, in chunks per request (prompt + output), drawn uniformly
DISTRIBUTIONS = {"short": (1,), "documents": (5, 6, 7)}


@dataclass(frozen=True)
class ProfileRequest:
    chunks: int  # KV chunks it holds at its end: prompt + output
    prompt: list[int]
    max_tokens: int
    arrival_s: float  # after the run starts


def parse_lengths(text: str) -> tuple[int, ...]:
    """`--lengths`: a named distribution or chunk counts separated by commas (drawn uniformly)."""
    if text in DISTRIBUTIONS:
        return DISTRIBUTIONS[text]
    try:
        lengths = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"--lengths must be {' or '.join(DISTRIBUTIONS)} or chunk counts such as 1,2,6; got {text!r}") from None
    if min(lengths) < 1:
        raise ValueError(f"--lengths: every chunk count must be at least 1, got {text!r}")
    return lengths


def parse_candidates(text: str) -> tuple[int, ...]:
    """`--candidates`: max_chunk_per_gpu values separated by commas."""
    try:
        values = tuple(sorted({int(part) for part in text.split(",")}))
    except ValueError:
        raise ValueError(f"--candidates must be whole numbers separated by commas, such as 1,2,4,8; got {text!r}") from None
    if values[0] < 1:
        raise ValueError(f"--candidates must be at least 1, got {text!r}")
    return values


def make_requests(vocab_size: int, chunk_size: int, lengths: tuple[int, ...], count: int, max_tokens: int,
                  qps: float | None, seed: int) -> list[ProfileRequest]:
    """`count` requests; a request of n chunks has a prompt of n * chunk_size - max_tokens tokens.
    qps None: all arrive at 0; else Poisson arrivals at that mean rate."""
    if not 1 <= max_tokens < chunk_size:
        raise ValueError(f"--max-tokens must be at least 1 and below the chunk size {chunk_size}, got {max_tokens}")
    rng = random.Random(seed)
    requests, arrival = [], 0.0
    for _ in range(count):
        chunks = rng.choice(lengths)
        requests.append(ProfileRequest(chunks, random_prompt(rng, vocab_size, chunks * chunk_size - max_tokens),
                                       max_tokens, arrival))
        if qps is not None:
            arrival += rng.expovariate(qps)
    return requests


def default_candidates(smallest: int, largest: int) -> tuple[int, ...]:
    """1, 2, 4, 6, 8, 12, 16, 24, 32, 48, ... from `smallest` up to `largest`, and both ends."""
    ladder, step = [1, 2, 4, 6, 8], 8
    while ladder[-1] < largest:
        ladder += [step * 3 // 2, step * 2]
        step *= 2
    return tuple(sorted({smallest, largest, *(v for v in ladder if smallest <= v <= largest)}))
