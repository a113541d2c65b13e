"""Which dtype an engine computes in, decided from what the device is, never by timing it:
every engine of a pool runs on one node type, so every engine of the pool chooses alike, and a
seeded or greedy request samples the same tokens on each of them.

- CUDA: bfloat16.
- A CPU where the engine's own bfloat16 projection kernel runs (engine/model/linear.py): natively
  with AVX512-BF16 or AMX, or with AVX2 by widening bf16 weights to float32 in registers. There
  bfloat16 reads half the weight bytes a decode step reads, and measured faster than float32 on
  each of those CPUs (see the benchmarks page of the documentation).
- Any other CPU (no AVX2, or the CPU kernels could not be built): float32, since torch would
  emulate bfloat16 there, several times slower.

The choice is logged with its reason and reported in the engine's registry entry."""

from dataclasses import dataclass

import torch

from engine.base.errors import EngineConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CHOICES = ("auto", *DTYPES)


@dataclass(frozen=True)
class DtypeChoice:
    name: str  # a key of DTYPES
    reason: str  # for the log: why this one

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.name]


def bf16_path(cpu_flags: set[str], kernel_has_bf16_linear: bool, amx_ready: bool) -> str | None:
    """How the engine's bf16 projections run on this CPU (AMX, AVX512-BF16 or AVX2), or None when
    they do not (the CPU kernels were not built, or the CPU has none of those)."""
    if not kernel_has_bf16_linear:
        return None
    if amx_ready:
        return "AMX"
    if "avx512_bf16" in cpu_flags:
        return "AVX512-BF16"
    return "AVX2" if "avx2" in cpu_flags else None


def choose_dtype(requested: str, device: str, cpu_bf16_path: str | None = None) -> DtypeChoice:
    """Resolve --dtype. `cpu_bf16_path`: bf16_path() of this CPU (read only for `auto` on a CPU)."""
    if requested not in CHOICES:
        raise EngineConfigError(f"dtype must be one of {', '.join(CHOICES)}, got {requested!r}")
    on_cuda = device.startswith("cuda")
    if requested == "float16" and not on_cuda:
        raise EngineConfigError("dtype float16 runs only on CUDA; on a CPU use float32, bfloat16 or auto")
    if requested != "auto":
        return DtypeChoice(requested, "set by --dtype")
    if on_cuda:
        return DtypeChoice("bfloat16", "auto: bfloat16 on CUDA")
    if cpu_bf16_path is None:
        return DtypeChoice("float32", "auto: float32, no bfloat16 projection kernel on this CPU (torch would emulate bf16)")
    return DtypeChoice("bfloat16", f"auto: bfloat16, the engine's bf16 projections run on this CPU ({cpu_bf16_path})")


def this_cpu_bf16_path() -> str | None:
    from engine.kernels.cpu_build import cpu_flags, cpu_kernel

    kernel = cpu_kernel()
    return bf16_path(cpu_flags(), kernel is not None and kernel.has_bf16_linear(), kernel is not None and kernel.amx_ready())
