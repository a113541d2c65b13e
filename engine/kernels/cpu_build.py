"""The CPU kernels (engine/kernels/csrc/: paged attention, the projections, the fused layer steps),
built ahead of time, once per instruction set, and chosen at run time by what the CPU has:

    generic      x86-64 baseline (or the build machine's own, off x86)
    avx2         AVX2 + FMA + F16C
    avx512bf16   the above + AVX512-F/BW/VL/DQ + AVX512-BF16
    amx          the above + AMX tiles (bf16)

`make` (or `python -m engine.kernels.cpu_build`) compiles every variant with its explicit flags,
whatever the build machine's CPU, so every path is at least compiled on every build, and fails
with the compiler's message when one does not build. A process then loads the variant its CPU
runs, compiling nothing: an engine image carries no compiler. The builds live in one folder per
variant, named by a digest of the sources and flags, under K25_CPU_KERNELS_DIR (default:
torch's extension root, ~/.cache/torch_extensions); the sources are copied in, so two checkouts of
one commit share a build instead of rebuilding each other's.

Where no build is there for this CPU (a checkout that skipped `make`), the first process builds
its own variant under a lock (35-53 s on 2 cores) and says so; where that fails too (no compiler),
the engine keeps the torch paths and says so once."""

import fcntl
import functools
import hashlib
import importlib.util
import logging
import os
import platform
import shutil
import sys
import time
from pathlib import Path

log = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
SOURCES = sorted(CSRC.glob("*.cpp"))
HEADERS = sorted(CSRC.glob("*.h"))
# fast-math's parts, not -ffast-math itself: linked with that, GCC sets flush-to-zero for the
# whole process, which would change every torch op's results on denormals. No contraction of
# a * b + c into one fused multiply-add: k25::exp_nonpositive's error bound assumes none
COMMON_FLAGS = ["-O3", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-ffinite-math-only",
                "-fno-signed-zeros", "-fassociative-math", "-freciprocal-math", "-ffp-contract=off"]
ON_X86 = platform.machine() in ("x86_64", "AMD64")
_AVX2 = ["-mavx2", "-mfma", "-mf16c"]
_AVX512BF16 = [*_AVX2, "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16"]
# variant -> (compiler flags, the CPU flags (as /proc/cpuinfo names them) it needs), best last
VARIANTS = {
    "generic": (["-march=x86-64"], set()),
    "avx2": (_AVX2, {"avx2", "fma", "f16c"}),
    "avx512bf16": (_AVX512BF16, {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}),
    "amx": ([*_AVX512BF16, "-mamx-tile", "-mamx-bf16"],
            {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "amx_tile", "amx_bf16"}),
} if ON_X86 else {"generic": (["-march=native"], set())}


def cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux lists them (empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith(("flags", "Features")):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def best_variant(flags: set[str]) -> str:
    """The most capable variant whose instructions this CPU has."""
    return [name for name, (_, needs) in VARIANTS.items() if needs <= flags][-1]


def runnable_variants(flags: set[str]) -> list[str]:
    return [name for name, (_, needs) in VARIANTS.items() if needs <= flags]


def kernels_root() -> Path:
    root = os.environ.get("K25_CPU_KERNELS_DIR") or os.environ.get("TORCH_EXTENSIONS_DIR")
    return Path(root or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torch_extensions")


def build_directory(variant: str) -> Path:
    """Where a variant's build of these sources with these flags lives; its name is the module's."""
    flags = COMMON_FLAGS + VARIANTS[variant][0]
    digest = hashlib.blake2b(b"".join(p.name.encode() + p.read_bytes() for p in SOURCES + HEADERS) + " ".join(flags).encode(),
                             digest_size=6)
    return kernels_root() / f"k25_cpu_kernels_{variant}_{digest.hexdigest()}"


def _built_library(directory: Path) -> Path | None:
    found = sorted(directory.glob(f"{directory.name}*.so"))
    return found[0] if found else None


def build(variant: str) -> Path:
    """Compile one variant (nothing when it is built already), without loading it: a variant this
    CPU cannot run must never be imported. Raises with the compiler's message."""
    # torch's own ninja build of an extension, without the import that load() does after it
    from torch.utils.cpp_extension import _write_ninja_file_and_build_library

    directory = build_directory(variant)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "k25.flock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # released by the kernel if this process dies
        (directory / "lock").unlink(missing_ok=True)  # torch's, left by a process killed mid-build
        if _built_library(directory) is None:
            sources = directory / "src"
            sources.mkdir(exist_ok=True)
            for path in SOURCES + HEADERS:  # the same paths in every checkout: no rebuilds between them
                shutil.copyfile(path, sources / path.name)
            _write_ninja_file_and_build_library(
                name=directory.name, sources=[str(sources / p.name) for p in SOURCES],
                extra_cflags=COMMON_FLAGS + VARIANTS[variant][0], extra_cuda_cflags=None, extra_sycl_cflags=None,
                extra_ldflags=["-fopenmp"], extra_include_paths=None, build_directory=str(directory), verbose=False,
                with_cuda=False, with_sycl=False)
    library = _built_library(directory)
    if library is None:
        raise RuntimeError(f"the {variant} CPU kernels built no library in {directory}")
    return library


def load_variant(variant: str):
    """Import a built variant (None if it is not built); compiles nothing."""
    import torch  # noqa: F401  (the module links against libtorch: load it first)

    directory = build_directory(variant)
    library = _built_library(directory)
    if library is None:
        return None
    spec = importlib.util.spec_from_file_location(directory.name, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def cpu_kernel():
    """This CPU's kernels, or None (with one warning) where they are not built and cannot be."""
    variant = best_variant(cpu_flags())
    module = load_variant(variant)
    if module is not None:
        return module
    started = time.monotonic()
    log.warning("CPU kernels (%s) not built ahead (`make`); building them now", variant)
    try:
        build(variant)
        module = load_variant(variant)
    except Exception as exc:  # no compiler, no headers: the torch paths still work
        log.warning("CPU kernels unavailable, using the torch paths (slower decode): %s", exc)
        return None
    log.info("CPU kernels (%s) ready in %.1f s", variant, time.monotonic() - started)
    return module


def main(argv: list[str]) -> int:
    """Build every variant (or those named); a failure names the variant and stops with status 1."""
    for variant in argv or list(VARIANTS):
        started = time.monotonic()
        try:
            library = build(variant)
        except Exception as exc:
            print(f"engine/kernels/cpu_build.py: the {variant} CPU kernels failed to build "
                  f"(flags {' '.join(VARIANTS[variant][0])}): {exc}", file=sys.stderr)
            return 1
        print(f"{variant:<11} {library}  ({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
