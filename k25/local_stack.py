"""Child processes of `k25 up`: start them, start again those that exit, stop every one.

Each child writes its log to a file in the stack's log folder (a child started again
appends to it). Each runs in a process group of its own, so that a Ctrl-C at the terminal
reaches only `k25 up`, which then stops its children in order. On Linux a child is also
told to receive SIGTERM if `k25 up` itself dies, so that not even a SIGKILL of the parent
leaves an orphan.

A child that exits on its own is started again with the same command (so the same ports)
after the delay of restart_policy.py; one that `stop` ended is not. Neither `stop` nor
`tend` blocks: a stopping child has its grace period to exit, and a later `tend` sends
SIGKILL once it has run out.
"""

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from k25.restart_policy import describe_exit, failures_in_a_row, restart_delay_s

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict
    log_path: str
    stop_phase: int  # stop_all ends the children of lower phases first
    grace_s: float  # from SIGTERM to SIGKILL
    process: subprocess.Popen | None = None
    started_at: float = 0.0  # time.monotonic() of the last start
    starts: int = 0
    failures: int = 0  # exits in a row without a healthy run between them
    restart_at: float | None = None  # set while it waits to be started again
    kill_at: float | None = None  # set once it was asked to stop: SIGKILL then
    metrics_url: str = ""  # where an engine serves /metrics
    announced_incarnation: str = ""  # the engine's registration last printed

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""


@dataclass(frozen=True)
class ChildEvent:
    child: Child
    what: str  # "exited" (it will start again), "restarted", "stopped" (as asked) or "killed" (grace ran out)
    message: str


class ProcessGroup:
    def __init__(self, log_dir: str):
        self.log_dir = log_dir
        self.children: list[Child] = []
        self._stopping_all = False

    def spawn(self, name: str, argv: list[str], stop_phase: int, grace_s: float, env: dict | None = None) -> Child:
        child = Child(name, argv, env or {}, os.path.join(self.log_dir, f"{name}.log"), stop_phase, grace_s)
        self._start(child)
        self.children.append(child)
        return child

    def _start(self, child: Child) -> None:
        with open(child.log_path, "ab") as log_file:
            child.process = subprocess.Popen(
                child.argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                env={**os.environ, **child.env}, preexec_fn=_die_with_parent, process_group=0,
            )
        child.started_at = time.monotonic()
        child.starts += 1
        child.restart_at = None

    def first_exited(self) -> Child | None:
        """A child that exited on its own and is not yet waiting to start again."""
        return next((c for c in self.children if c.kill_at is None and c.restart_at is None and not c.running), None)

    def stop(self, child: Child, now: float) -> None:
        """Ask `child` to stop (SIGTERM) and never start it again; `tend` reports when it has."""
        if child.kill_at is not None:
            return
        child.restart_at = None
        child.kill_at = now + child.grace_s
        if child.running:
            child.process.send_signal(signal.SIGTERM)

    def tend(self, now: float) -> list[ChildEvent]:
        """One round: notice exits, schedule and make restarts, SIGKILL stops past their grace."""
        events = []
        for child in list(self.children):
            if child.kill_at is not None:
                if not child.running:
                    self.children.remove(child)
                    events.append(ChildEvent(child, "stopped", f"{child.name:<18} stopped"))
                elif now >= child.kill_at:
                    child.process.kill()
                    child.process.wait()
                    self.children.remove(child)
                    events.append(ChildEvent(child, "killed", f"{child.name:<18} did not stop within {child.grace_s:.0f} s "
                                                              f"of SIGTERM; killed"))
            elif self._stopping_all:
                continue
            elif child.restart_at is not None:
                if now >= child.restart_at:
                    self._start(child)
                    events.append(ChildEvent(child, "restarted", f"{child.name:<18} started again (start {child.starts})"))
            elif not child.running:
                ran_for_s = now - child.started_at
                child.failures = failures_in_a_row(child.failures, ran_for_s)
                delay_s = restart_delay_s(child.failures)
                child.restart_at = now + delay_s
                events.append(ChildEvent(child, "exited", (
                    f"{child.name:<18} exited with {describe_exit(child.process.returncode)} after {ran_for_s:.0f} s; "
                    f"starting it again in {delay_s:.0f} s (log {child.log_path})")))
        return events

    def stop_all(self, report: Callable[[ChildEvent], None] = lambda event: None) -> None:
        """Stop every child, one phase after another: each phase's children get SIGTERM
        together and the next phase starts once all of them have exited or were killed.
        Nothing is started again from here on."""
        self._stopping_all = True
        for phase in sorted({c.stop_phase for c in self.children}):
            ending = [c for c in self.children if c.stop_phase == phase]
            now = time.monotonic()
            for child in ending:
                self.stop(child, now)
            while any(c in self.children for c in ending):
                for event in self.tend(time.monotonic()):
                    report(event)
                time.sleep(0.05)
