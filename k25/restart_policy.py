"""When `k25 up` starts a child again after it exited: as a kubelet restarts a container,
with a delay that doubles while the child keeps failing, and starts over once it ran long
enough to count as healthy."""

import signal

FIRST_DELAY_S = 1.0
MAX_DELAY_S = 30.0
# a child that ran this long before it exited was healthy: its next delay is the first again
HEALTHY_RUN_S = 60.0


def failures_in_a_row(previous: int, ran_for_s: float) -> int:
    """The child's count of exits without a healthy run between them, this exit included."""
    return 1 if ran_for_s >= HEALTHY_RUN_S else previous + 1


def restart_delay_s(failures: int) -> float:
    """Seconds to wait before starting a child that has exited `failures` times in a row."""
    if failures < 1:
        raise ValueError(f"a restart follows at least one exit, got {failures}")
    return min(MAX_DELAY_S, FIRST_DELAY_S * 2 ** min(failures - 1, 16))


def describe_exit(returncode: int) -> str:
    """'code 3', or 'signal SIGKILL' for a child a signal ended (Popen's negative codes)."""
    if returncode >= 0:
        return f"code {returncode}"
    try:
        return f"signal {signal.Signals(-returncode).name}"
    except ValueError:
        return f"signal {-returncode}"
