"""A seeded request trace for the autoscaling simulation: a diurnal curve (quiet at night,
busy in the afternoon) with bursts on top, counted per second like the gateway counts."""

import math
from dataclasses import dataclass

import numpy as np

DAY_S = 86_400


@dataclass(frozen=True)
class TraceShape:
    duration_s: int = DAY_S
    night_qps: float = 150.0
    peak_qps: float = 1_600.0
    peak_hour: float = 14.0
    bursts_per_hour: float = 1.5
    burst_gain: tuple[float, float] = (0.3, 1.5)  # extra load, as a fraction of the diurnal load
    burst_mean_s: float = 300.0  # bursts last this long on average (exponential)
    burst_rise_s: tuple[float, float] = (10.0, 90.0)


def request_rate(shape: TraceShape, rng: np.random.Generator) -> np.ndarray:
    """The expected requests per second, one value per second of the trace."""
    t = np.arange(shape.duration_s, dtype=float)
    phase = 2 * math.pi * (t / DAY_S - shape.peak_hour / 24)
    rate = shape.night_qps + (shape.peak_qps - shape.night_qps) * (1 + np.cos(phase)) / 2
    bursts = np.zeros_like(rate)
    n_bursts = rng.poisson(shape.bursts_per_hour * shape.duration_s / 3600)
    for start in np.sort(rng.uniform(0, shape.duration_s, n_bursts)):
        gain = rng.uniform(*shape.burst_gain)
        length = max(30.0, rng.exponential(shape.burst_mean_s))
        rise = rng.uniform(*shape.burst_rise_s)
        since = t - start
        ramp = np.clip(since / rise, 0, 1) * np.clip((start + length + rise - t) / rise, 0, 1)
        bursts += gain * rate * ramp * (since >= 0)
    return rate + bursts


def request_counts(shape: TraceShape, seed: int) -> np.ndarray:
    """Requests that arrive in each second (Poisson around the rate)."""
    rng = np.random.default_rng(seed)
    return rng.poisson(request_rate(shape, rng)).astype(float)
