"""The CPU kernels (engine/kernels/csrc/: paged attention and the fused layer steps), one module
compiled at first use for the CPU it runs on and cached (under TORCH_EXTENSIONS_DIR, by default
~/.cache/torch_extensions, in a folder per CPU, source and flags): about 25-40 s the first time
on 2 cores, a load after that. Processes that start together wait for one build; a process
killed mid-build leaves torch's lock file behind, which would make every later start wait
forever, so the build runs under a lock the kernel releases when its holder dies, and that
lock's holder clears torch's.

Where it cannot be built (no C++ compiler, no Python headers) the engine keeps the torch
paths and says so once."""

import fcntl
import functools
import hashlib
import logging
import os
import platform
import time
from pathlib import Path

log = logging.getLogger(__name__)

SOURCES = sorted((Path(__file__).parent / "csrc").glob("*.cpp"))
HEADERS = sorted((Path(__file__).parent / "csrc").glob("*.h"))
# fast-math's parts, not -ffast-math itself: linked with that, GCC sets flush-to-zero for the
# whole process, which would change every torch op's results on denormals. No contraction of
# a * b + c into one fused multiply-add: k25::exp_nonpositive's error bound assumes none
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-ffinite-math-only",
         "-fno-signed-zeros", "-fassociative-math", "-freciprocal-math", "-ffp-contract=off"]


def _build_tag() -> str:
    """A short digest of this CPU's model and feature flags, the source and the flags: a build
    for another CPU (a cache folder shared between machines) or of another source (another
    checkout) is never loaded here, nor rebuilt in the same folder."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        described = "\n".join(sorted({line for line in lines if line.startswith(("flags", "model name", "Features", "CPU part"))}))
    except OSError:
        described = platform.processor() + platform.machine()
    digest = hashlib.blake2b(described.encode() + b"".join(source.read_bytes() for source in SOURCES + HEADERS) + " ".join(FLAGS).encode(), digest_size=6)
    return digest.hexdigest()


def build_directory() -> Path:
    """Where this machine's build of this source lives (in torch's extension root); its name is
    the module's."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torch_extensions"
    return Path(root) / f"k25_cpu_kernels_{_build_tag()}"


@functools.cache
def cpu_kernel():
    """The compiled module, or None (with one warning) when it cannot be built here."""
    from torch.utils.cpp_extension import load

    started = time.monotonic()
    directory = build_directory()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / "k25.flock", "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)  # released by the kernel if this process dies
            (directory / "lock").unlink(missing_ok=True)  # torch's, left by a process killed mid-build
            module = load(name=directory.name, sources=[str(source) for source in SOURCES], extra_cflags=FLAGS, extra_ldflags=["-fopenmp"],
                          build_directory=str(directory))
    except Exception as exc:  # no compiler, no headers, an unsupported -march: the torch path still works
        log.warning("CPU kernels unavailable, using the torch paths (slower decode): %s", exc)
        return None
    log.info("CPU kernels ready in %.1f s", time.monotonic() - started)
    return module
