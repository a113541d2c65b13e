"""Which dtype an engine computes in: bfloat16 on CUDA; on a CPU whichever of float32 and
bfloat16 multiplies the model's own matrices faster on the machine it starts on.

A CPU with native bf16 instructions (AVX512-BF16, AMX) runs bf16 matmuls faster and reads half
the bytes every decode step; one without them emulates bf16 and is several times slower at
batch sizes above one. Neither the CPU flags nor the torch build tell reliably which kernels
torch will pick, so `auto` measures: the MLP's matmul at batch 1 (a decode step) and at the
step's sequence limit (a full decode batch), in both dtypes, best of a few runs each, and takes
bfloat16 only when its sum is at least MARGIN times lower. On a model or machine where the
two are close (a tiny model is all overhead) the measurement is noise, and a choice that
flipped from one start to the next would change what a seeded request samples; near a tie
float32 (exact) wins. The choice is logged with its timings.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.base.errors import EngineConfigError
from engine.base.model_config import ModelConfig
from engine.linear import Weight

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CPU_CANDIDATES = ("float32", "bfloat16")
CHOICES = ("auto", *DTYPES)
# how much faster than float32 another dtype must measure to be chosen (bf16 where it is native
# is 3-5x faster at these sizes; within 1.5x the difference is noise or emulation)
MARGIN = 1.5


@dataclass(frozen=True)
class DtypeChoice:
    name: str  # a key of DTYPES
    reason: str  # for the log: why this one

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.name]


def faster_dtype(seconds: dict[str, float]) -> str:
    """The fastest candidate if it beats float32 by MARGIN, else float32 (it is exact)."""
    fastest = min(seconds, key=lambda name: (seconds[name], name != "float32"))
    return fastest if seconds[fastest] * MARGIN <= seconds["float32"] else "float32"


def choose_dtype(requested: str, device: str, measure: Callable[[str], float]) -> DtypeChoice:
    """Resolve --dtype. `measure(name)` gives the seconds a representative step's matmuls take
    in that dtype on this CPU; it is called only for `auto` on a CPU."""
    if requested not in CHOICES:
        raise EngineConfigError(f"dtype must be one of {', '.join(CHOICES)}, got {requested!r}")
    on_cuda = device.startswith("cuda")
    if requested == "float16" and not on_cuda:
        raise EngineConfigError("dtype float16 runs only on CUDA; on a CPU use float32, bfloat16 or auto")
    if requested != "auto":
        return DtypeChoice(requested, "set by --dtype")
    if on_cuda:
        return DtypeChoice("bfloat16", "auto: bfloat16 on CUDA")
    seconds = {name: measure(name) for name in CPU_CANDIDATES}
    timings = ", ".join(f"{name} {s * 1000:.2f} ms" for name, s in seconds.items())
    return DtypeChoice(faster_dtype(seconds), f"auto: bfloat16 if {MARGIN}x faster than float32 on this CPU ({timings})")


def matmul_seconds(config: ModelConfig, batch_sizes: tuple[int, ...], repeats: int = 5) -> Callable[[str], float]:
    """A `measure` for choose_dtype: the model's gate/up matmul at each batch size, through the
    engine's own projection (engine.linear), the best of `repeats` runs each after one warm-up,
    summed over the batch sizes."""

    def measure(name: str) -> float:
        dtype = DTYPES[name]
        generator = torch.Generator().manual_seed(0)
        weight = Weight(torch.randn(2 * config.intermediate_size, config.hidden_size, generator=generator).to(dtype))
        total = 0.0
        for batch in batch_sizes:
            x = torch.randn(batch, config.hidden_size, generator=generator).to(dtype)
            weight(x)
            best = float("inf")
            for _ in range(repeats):
                started = time.perf_counter()
                weight(x)
                best = min(best, time.perf_counter() - started)
            total += best
        return total

    return measure
