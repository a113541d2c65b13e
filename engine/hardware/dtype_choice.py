"""Which dtype an engine computes in: bfloat16 on CUDA; on a CPU whichever of float32 and
bfloat16 multiplies the model's own matrices faster on the machine it starts on.

A CPU with native bf16 instructions (AVX512-BF16, AMX) runs bf16 matmuls faster and reads half
the bytes every decode step; one without them emulates bf16 and is several times slower at
batch sizes above one. Neither the CPU flags nor the torch build tell reliably which kernels
torch will pick, so `auto` measures: the MLP's matmul at batch 1 (a decode step at low load,
where the weights' bytes decide) and at the step's sequence limit (a full decode batch, where
the arithmetic does), in both dtypes, best of a few runs each, and takes bfloat16 only when the
geometric mean of its speedups at the two is at least MARGIN: each batch size stands for a
serving regime, so a 2x gain at one cancels a 2x loss at the other (summed times would let the
full batch decide alone: on an AVX2-only CPU bf16 read half the bytes at batch 1, 1.6-2.5x
faster, and tied at 64 rows, and served 1.14x fp32's tokens/s at 64 streams and a third of its
inter-token latency at 1 QPS, 2026-12-06). On a model or machine where the two are close (a
tiny model is all overhead) the measurement is noise, and a choice that flipped from one start
to the next would change what a seeded request samples; near a tie float32 (exact) wins. The
choice is logged with its timings.
"""

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.base.errors import EngineConfigError
from engine.base.model_config import ModelConfig
from engine.model.linear import Weight

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CPU_CANDIDATES = ("float32", "bfloat16")
CHOICES = ("auto", *DTYPES)
# how much faster than float32 (geometric mean over the batch sizes) another dtype must measure
# to be chosen: bf16 where it is native is 3-5x faster at these sizes, 1.25-1.54x on an AVX2-only
# CPU (four rounds); within 1.2x the difference is noise
MARGIN = 1.2


@dataclass(frozen=True)
class DtypeChoice:
    name: str  # a key of DTYPES
    reason: str  # for the log: why this one

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.name]


def speedup(seconds: dict[str, tuple[float, ...]], name: str) -> float:
    """The geometric mean over the batch sizes of float32's time over `name`'s."""
    ratios = [fp32 / other for fp32, other in zip(seconds["float32"], seconds[name], strict=True)]
    return math.prod(ratios) ** (1 / len(ratios))


def faster_dtype(seconds: dict[str, tuple[float, ...]]) -> str:
    """The candidate with the largest speedup over float32 if that is at least MARGIN, else
    float32 (it is exact). `seconds[name]`: one time per batch size, in the same order."""
    fastest = max(seconds, key=lambda name: (speedup(seconds, name), name == "float32"))
    return fastest if speedup(seconds, fastest) >= MARGIN else "float32"


def choose_dtype(requested: str, device: str, measure: Callable[[str], tuple[float, ...]]) -> DtypeChoice:
    """Resolve --dtype. `measure(name)` gives the seconds a representative step's matmuls take
    in that dtype on this CPU, one per batch size; it is called only for `auto` on a CPU."""
    if requested not in CHOICES:
        raise EngineConfigError(f"dtype must be one of {', '.join(CHOICES)}, got {requested!r}")
    on_cuda = device.startswith("cuda")
    if requested == "float16" and not on_cuda:
        raise EngineConfigError("dtype float16 runs only on CUDA; on a CPU use float32, bfloat16 or auto")
    if requested != "auto":
        return DtypeChoice(requested, "set by --dtype")
    if on_cuda:
        return DtypeChoice("bfloat16", "auto: bfloat16 on CUDA")
    seconds = {name: tuple(measure(name)) for name in CPU_CANDIDATES}
    timings = ", ".join(f"{name} {' / '.join(f'{s * 1000:.2f}' for s in times)} ms" for name, times in seconds.items())
    return DtypeChoice(faster_dtype(seconds), f"auto: bfloat16 if {MARGIN}x faster than float32 on this CPU in the geometric mean "
                                              f"over the batch sizes ({timings})")


def matmul_seconds(config: ModelConfig, batch_sizes: tuple[int, ...], repeats: int = 5) -> Callable[[str], tuple[float, ...]]:
    """A `measure` for choose_dtype: the model's gate/up matmul at each batch size, through the
    engine's own projection (engine.model.linear), the best of `repeats` runs each after one warm-up."""

    def measure(name: str) -> tuple[float, ...]:
        dtype = DTYPES[name]
        generator = torch.Generator().manual_seed(0)
        weight = Weight(torch.randn(2 * config.intermediate_size, config.hidden_size, generator=generator).to(dtype))
        times = []
        for batch in batch_sizes:
            x = torch.randn(batch, config.hidden_size, generator=generator).to(dtype)
            weight(x)
            best = float("inf")
            for _ in range(repeats):
                started = time.perf_counter()
                weight(x)
                best = min(best, time.perf_counter() - started)
            times.append(best)
        return tuple(times)

    return measure
