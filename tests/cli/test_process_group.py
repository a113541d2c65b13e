"""`k25 up`'s process group on plain Python child processes: an exit is followed by a start
of the same command after the policy's delay, a stop is never undone, a child that ignores
SIGTERM is killed when its grace runs out, and stop_all ends one phase after another.

`tend` takes the time as an argument, so the delays are checked without waiting for them."""

import signal
import sys
import time

from k25.local_stack import ProcessGroup
from k25.restart_policy import FIRST_DELAY_S
from tests.helpers.engine_process import wait_until

EXITS_AT_ONCE = "print('started', flush=True); raise SystemExit(3)"
RUNS = "import time; print('started', flush=True); time.sleep(120)"
IGNORES_SIGTERM = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                   "print('started', flush=True); time.sleep(120)")


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def started(child, times: int = 1) -> bool:
    with open(child.log_path) as f:
        return f.read().count("started") >= times


def test_a_child_that_exits_starts_again_after_the_delay_and_the_delay_doubles(tmp_path):
    group = ProcessGroup(str(tmp_path))
    child = group.spawn("quitter", python(EXITS_AT_ONCE), stop_phase=0, grace_s=5)
    child.process.wait(timeout=30)
    exited_at = time.monotonic()
    [event] = group.tend(exited_at)
    assert event.what == "exited" and "code 3" in event.message and f"again in {FIRST_DELAY_S:.0f} s" in event.message
    assert group.tend(exited_at + FIRST_DELAY_S / 2) == []
    [event] = group.tend(exited_at + FIRST_DELAY_S)
    assert event.what == "restarted" and child.starts == 2
    wait_until(lambda: started(child, times=2), timeout_s=30, what="the second start writing to the same log")
    child.process.wait(timeout=30)
    [event] = group.tend(time.monotonic())
    assert event.what == "exited" and f"again in {2 * FIRST_DELAY_S:.0f} s" in event.message
    group.stop_all()
    assert group.children == []


def test_a_stopped_child_is_not_started_again(tmp_path):
    group = ProcessGroup(str(tmp_path))
    child = group.spawn("worker", python(RUNS), stop_phase=0, grace_s=30)
    wait_until(lambda: started(child), timeout_s=30, what="the child")
    group.stop(child, time.monotonic())
    child.process.wait(timeout=30)
    [event] = group.tend(time.monotonic())
    assert event.what == "stopped" and group.children == []
    assert group.tend(time.monotonic() + 3600) == [] and child.starts == 1


def test_a_child_waiting_to_start_again_can_be_stopped(tmp_path):
    group = ProcessGroup(str(tmp_path))
    child = group.spawn("quitter", python(EXITS_AT_ONCE), stop_phase=0, grace_s=5)
    child.process.wait(timeout=30)
    [exited] = group.tend(time.monotonic())
    group.stop(child, time.monotonic())
    [event] = group.tend(time.monotonic() + 3600)
    assert (exited.what, event.what) == ("exited", "stopped") and child.starts == 1


def test_a_child_that_ignores_sigterm_is_killed_when_its_grace_runs_out(tmp_path):
    group = ProcessGroup(str(tmp_path))
    child = group.spawn("stubborn", python(IGNORES_SIGTERM), stop_phase=0, grace_s=2)
    wait_until(lambda: started(child), timeout_s=30, what="the child ignoring SIGTERM")
    asked_at = time.monotonic()
    group.stop(child, asked_at)
    assert group.tend(asked_at + 1) == [] and child.running
    [event] = group.tend(asked_at + 2)
    assert event.what == "killed" and "within 2 s" in event.message
    assert child.process.returncode == -signal.SIGKILL


def test_stop_all_ends_one_phase_after_another_and_starts_nothing_again(tmp_path):
    group = ProcessGroup(str(tmp_path))
    # the first phase outlives its SIGTERM for a second; the last phase exits meanwhile on its own
    slow = group.spawn("engine", python(IGNORES_SIGTERM), stop_phase=0, grace_s=1)
    front = group.spawn("gateway", python(RUNS), stop_phase=1, grace_s=30)
    last = group.spawn("redis", python(EXITS_AT_ONCE), stop_phase=2, grace_s=30)
    wait_until(lambda: started(slow) and started(front) and started(last), timeout_s=30, what="every child")
    reported = []
    group.stop_all(reported.append)
    assert [(e.child.name, e.what) for e in reported] == [("engine", "killed"), ("gateway", "stopped"), ("redis", "stopped")]
    assert last.starts == 1 and group.children == []
