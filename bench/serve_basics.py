"""What `k25 bench serve`'s workloads share: the arrival schedule, and how a gateway's refusal
reads."""

import json

import numpy as np


def poisson_times(qps: float, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` arrival offsets of a Poisson process of rate `qps`, the first at 0."""
    if qps <= 0 or count < 1:
        raise ValueError(f"qps must be positive and count at least 1, got {qps} and {count}")
    return np.concatenate([[0.0], np.cumsum(rng.exponential(1.0 / qps, size=count - 1))])


class CannotBenchmark(Exception):
    """The gateway cannot be reached or refuses the workload; the message says why, for the user."""


def error_message_of(content: bytes) -> str:
    try:
        return json.loads(content)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return content.decode(errors="replace")[:200]
