"""Seeded request traces for the autoscaling simulation, counted per second like the
gateway counts. Each shape is the expected requests per second, one value per second;
`request_counts` draws Poisson arrivals around it.

- diurnal: quiet at night, busy in the afternoon, with bursts on top (a week by default);
- morning-ramp: a quiet night, then the working day arrives within two hours;
- step: the load jumps at once (a new client switched on) and stays;
- flash-crowd: the load rises several-fold within half a minute, holds, then ebbs away;
- slow-decline: the load falls from busy to quiet over the whole trace;
- noise: a steady mean with minute-scale wobbles and no trend.
The non-diurnal shapes place their event at a seeded time, so seeds differ in more than noise.
"""

import math
from dataclasses import dataclass

import numpy as np

DAY_S = 86_400
HOUR_S = 3_600


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
    """The diurnal shape's expected requests per second."""
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


def _ramp(t: np.ndarray, start: float, length: float) -> np.ndarray:
    """0 before `start`, 1 after `start + length`, linear in between."""
    return np.clip((t - start) / max(length, 1.0), 0, 1)


def morning_ramp(duration_s: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(duration_s, dtype=float)
    start, length = rng.uniform(0.15, 0.35) * duration_s, rng.uniform(1.0, 2.0) * HOUR_S
    day_qps = rng.uniform(1_200, 1_800)
    # a smooth S-curve: people arrive slowly, then all at once, then the last few
    rise = (1 - np.cos(math.pi * _ramp(t, start, length))) / 2
    return 150.0 + (day_qps - 150.0) * rise


def step(duration_s: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(duration_s, dtype=float)
    before, factor = rng.uniform(200, 500), rng.uniform(2.0, 4.0)
    return before + before * (factor - 1) * (t >= rng.uniform(0.2, 0.5) * duration_s)


def flash_crowd(duration_s: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(duration_s, dtype=float)
    base, factor = rng.uniform(200, 400), rng.uniform(3.0, 6.0)
    start, rise = rng.uniform(0.2, 0.5) * duration_s, rng.uniform(10, 30)
    hold, ebb = rng.uniform(10, 30) * 60, rng.uniform(20, 60) * 60
    crowd = _ramp(t, start, rise) * (1 - _ramp(t, start + rise + hold, ebb))
    return base * (1 + (factor - 1) * crowd)


def slow_decline(duration_s: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(duration_s, dtype=float)
    high, low = rng.uniform(1_400, 1_800), rng.uniform(100, 250)
    return high - (high - low) * t / duration_s


def noise(duration_s: int, rng: np.random.Generator) -> np.ndarray:
    """A mean of 600-1000 QPS times a slowly wandering factor (an AR(1) process per minute,
    about +-10%) with no trend."""
    mean = rng.uniform(600, 1_000)
    minutes = duration_s // 60 + 2
    wobble = np.zeros(minutes)
    for i in range(1, minutes):
        wobble[i] = 0.8 * wobble[i - 1] + rng.normal(0, 0.06)
    per_second = np.interp(np.arange(duration_s) / 60, np.arange(minutes), wobble)
    return mean * (1 + per_second)


SHAPES = {"morning-ramp": morning_ramp, "step": step, "flash-crowd": flash_crowd,
          "slow-decline": slow_decline, "noise": noise}
TRACES = ("diurnal",) + tuple(SHAPES)


def trace_rate(trace: str, duration_s: int, rng: np.random.Generator) -> np.ndarray:
    if trace == "diurnal":
        return request_rate(TraceShape(duration_s=duration_s), rng)
    if trace not in SHAPES:
        raise ValueError(f"unknown trace {trace!r}; known: {', '.join(TRACES)}")
    return SHAPES[trace](duration_s, rng)


def request_counts(trace: str, duration_s: int, seed: int) -> np.ndarray:
    """Requests that arrive in each second (Poisson around the rate)."""
    rng = np.random.default_rng(seed)
    return rng.poisson(np.maximum(trace_rate(trace, duration_s, rng), 0)).astype(float)
