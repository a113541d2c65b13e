"""The CPU paged-attention kernel (engine/csrc/paged_attention_cpu.cpp), compiled at first use
for the CPU it runs on and cached (under TORCH_EXTENSIONS_DIR, by default
~/.cache/torch_extensions, in a folder per CPU, source and flags): about 25 s the first time
on 2 cores, a load after that. Processes that start together wait for one build; a process
killed mid-build leaves torch's lock file behind, which would make every later start wait
forever, so the build runs under a lock the kernel releases when its holder dies, and that
lock's holder clears torch's.

One call attends a whole step (the varlen layout of engine/forward_batch.py, as the Triton
kernel reads it): each K/V row read in place, where the torch path gathers every decode's
and later slice's blocks per layer and runs SDPA per first slice (engine/attention.py picks
it). Where it cannot be built (no C++ compiler, no Python headers) the engine keeps the torch
path and says so once."""

import fcntl
import functools
import hashlib
import logging
import os
import platform
import time
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "paged_attention_cpu.cpp"
# fast-math's parts, not -ffast-math itself: linked with that, GCC sets flush-to-zero for the
# whole process, which would change every torch op's results on denormals
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-ffinite-math-only",
         "-fno-signed-zeros", "-fassociative-math", "-freciprocal-math"]


def _build_tag() -> str:
    """A short digest of this CPU's model and feature flags, the source and the flags: a build
    for another CPU (a cache folder shared between machines) or of another source (another
    checkout) is never loaded here, nor rebuilt in the same folder."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        described = "\n".join(sorted({line for line in lines if line.startswith(("flags", "model name", "Features", "CPU part"))}))
    except OSError:
        described = platform.processor() + platform.machine()
    digest = hashlib.blake2b(described.encode() + SOURCE.read_bytes() + " ".join(FLAGS).encode(), digest_size=6)
    return digest.hexdigest()


def build_directory() -> Path:
    """Where this machine's build of this source lives (in torch's extension root); its name is
    the module's."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torch_extensions"
    return Path(root) / f"k25_paged_attention_cpu_{_build_tag()}"


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
            module = load(name=directory.name, sources=[str(SOURCE)], extra_cflags=FLAGS, extra_ldflags=["-fopenmp"],
                          build_directory=str(directory))
    except Exception as exc:  # no compiler, no headers, an unsupported -march: the torch path still works
        log.warning("CPU attention kernel unavailable, using the torch path (slower decode): %s", exc)
        return None
    log.info("CPU attention kernel ready in %.1f s", time.monotonic() - started)
    return module


def paged_attention_cpu(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                        query_start: torch.Tensor, seq_lens: torch.Tensor, block_size: int, scale: float) -> torch.Tensor:
    """[tokens, heads, head_dim]: sequence s's query rows query_start[s]:query_start[s + 1], the
    last of them at position seq_lens[s] - 1, each attending causally to its sequence's cached
    tokens (theirs included: write K/V first). k_cache, v_cache: [kv_heads, slots, head_dim];
    block_tables [S, blocks], query_start [S + 1] and seq_lens [S] int32 (the reference's
    contract, engine/paged_attention_reference.py, with the caches heads first). Raises
    RuntimeError on malformed arguments, or when the kernel is unavailable (cpu_kernel() says)."""
    kernel = cpu_kernel()
    if kernel is None:
        raise RuntimeError("the CPU attention kernel could not be built")
    return kernel.paged_attention(q.contiguous(), k_cache, v_cache, block_tables.contiguous(), query_start.contiguous(),
                                  seq_lens.contiguous(), block_size, scale)
