"""How many threads the engine computes on, on a CPU.

torch starts one thread per core of the machine, whatever share of it the process was given.
In a container limited to fewer CPUs (a pod's `resources.limits.cpu`: a CFS quota) or pinned
to some (a cpuset), or beside other engines on one machine (`k25 up --engines 2`), that
oversubscribes the CPUs: OpenMP threads wait at every barrier for peers that the kernel has
descheduled, and a step slows several times (the benchmarks page of the docs has the figures).
The default is the CPUs this process may use: its affinity set, capped by its cgroup's CPU
quota (rounded down: threads beyond the quota are throttled, not run).

Between two parallel regions torch's OpenMP (libgomp) threads spin before they sleep: by
default for most of a 10 ms pause here (a matmul, then a 10 ms sleep: 7.9 ms of CPU a round).
The engine's main thread runs Python between steps (scheduling, sampling, sending), and all
that while the other threads spin on cores that the gateway (`k25 up`) or the pod's CPU
quota needed. The engine sets 10,000 turns (about 1 ms): enough to bridge the gaps between the ops of one step, so a
step is not slower, while a small model's steps no longer take the cores from the rest (measured:
the benchmarks page of the docs)."""

import math
import os
from pathlib import Path

AUTO = "auto"

OMP_SPIN_COUNT = 10_000

CGROUP_V2_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1_QUOTA = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
CGROUP_V1_PERIOD = Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us")


def usable_cpus(affinity: int, quota_cpus: float | None) -> int:
    """The threads to run: the affinity set's size, capped by the quota (in CPUs) when there is one."""
    if quota_cpus is None:
        return max(1, affinity)
    return max(1, min(affinity, math.floor(quota_cpus)))


def parse_cgroup_v2_cpu_max(text: str) -> float | None:
    """`cpu.max` holds "QUOTA PERIOD" in microseconds, QUOTA "max" when unlimited."""
    fields = text.split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    quota, period = int(fields[0]), int(fields[1])
    return quota / period if quota > 0 and period > 0 else None


def parse_cgroup_v1_quota(quota_text: str, period_text: str) -> float | None:
    """cgroup v1: cfs_quota_us is -1 when unlimited."""
    quota, period = int(quota_text), int(period_text)
    return quota / period if quota > 0 and period > 0 else None


def cgroup_cpu_quota() -> float | None:
    """This process's cgroup CPU quota in CPUs, or None when it has none (or it cannot be read)."""
    try:
        if CGROUP_V2_CPU_MAX.exists():
            return parse_cgroup_v2_cpu_max(CGROUP_V2_CPU_MAX.read_text())
        if CGROUP_V1_QUOTA.exists():
            return parse_cgroup_v1_quota(CGROUP_V1_QUOTA.read_text(), CGROUP_V1_PERIOD.read_text())
    except (OSError, ValueError):
        pass
    return None


def default_cpu_threads() -> int:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return usable_cpus(affinity, cgroup_cpu_quota())


def threads_per_engine(cpus: int, engines: int) -> int:
    """Each of `engines` engines sharing `cpus` CPUs gets an equal whole share, at least one."""
    return max(1, cpus // max(1, engines))


def omp_wait_env(environ) -> dict[str, str]:
    """The OpenMP setting the engine starts torch with: the spin count above, unless the
    environment already says how OpenMP threads wait (GOMP_SPINCOUNT or OMP_WAIT_POLICY).
    libgomp reads it once, when torch is first imported."""
    if "GOMP_SPINCOUNT" in environ or "OMP_WAIT_POLICY" in environ:
        return {}
    return {"GOMP_SPINCOUNT": str(OMP_SPIN_COUNT)}
