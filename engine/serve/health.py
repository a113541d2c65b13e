"""Whether an engine's steps work, judged from when they finished and whether they failed.

An engine is unhealthy after `max_failed_steps` failed steps in a row, or while it has work
it could step and no step has finished for `step_stall_s` (a wedged step: the serving thread
is stuck inside it, so the judge must be another thread). One successful step makes it
healthy again. A step that ran no forward (nothing was scheduled) neither fails nor succeeds.

The serving thread records steps in a StepHealth; the heartbeat and the /healthz handler ask
it for a report from their own threads, so its state sits behind a lock."""

import threading
import time
from collections import deque
from dataclasses import dataclass

# `step_failures` counts the failed steps of this many seconds before the report
FAILURE_WINDOW_S = 60.0


@dataclass(frozen=True)
class HealthSettings:
    max_failed_steps: int = 3  # failed steps in a row that make the engine unhealthy
    step_stall_s: float = 60.0  # seconds with work and no finished step that make it unhealthy


@dataclass(frozen=True)
class HealthReport:
    healthy: bool
    reason: str  # why not healthy; "" when healthy
    last_step_at: float | None  # unix time the last step finished; None before the first
    step_failures: int  # failed steps in the last FAILURE_WINDOW_S
    draining: bool  # shutting down: takes no new requests, finishes the running ones

    def fields(self) -> dict:
        """As the registry entry and /healthz carry it."""
        return {
            "healthy": self.healthy,
            "unhealthy_reason": self.reason,
            "draining": self.draining,
            "last_step_at": None if self.last_step_at is None else round(self.last_step_at, 3),
            "step_failures": self.step_failures,
        }


# what an engine that has not stepped yet reports
FRESH = HealthReport(healthy=True, reason="", last_step_at=None, step_failures=0, draining=False)


def unhealthy_reason(failed_in_a_row: int, busy_since: float | None, last_step_done: float | None, now: float,
                     settings: HealthSettings) -> str:
    """Why the engine is unhealthy, or "" if it is not. Times are one clock's seconds:
    `busy_since` when it last went from nothing to step to something (None: nothing to step now),
    `last_step_done` when its last step finished."""
    if failed_in_a_row >= settings.max_failed_steps:
        return f"its last {failed_in_a_row} steps failed"
    if busy_since is not None:
        waiting_since = busy_since if last_step_done is None else max(busy_since, last_step_done)
        if now - waiting_since > settings.step_stall_s:
            return (f"no step finished for {now - waiting_since:.0f} s while it had requests to run "
                    f"(stall limit {settings.step_stall_s:g} s)")
    return ""


class StepHealth:
    def __init__(self, settings: HealthSettings = HealthSettings()):
        if settings.max_failed_steps < 1:
            raise ValueError(f"max_failed_steps must be at least 1, got {settings.max_failed_steps}")
        if not settings.step_stall_s > 0:
            raise ValueError(f"step_stall_s must be positive, got {settings.step_stall_s}")
        self.settings = settings
        self._lock = threading.Lock()
        self._failed_in_a_row = 0
        self._failures: deque[float] = deque()  # monotonic times of failed steps within the window
        self._busy_since: float | None = None  # monotonic
        self._last_step_done: float | None = None  # monotonic
        self._last_step_at: float | None = None  # unix

    def busy(self) -> None:
        """The engine has work it can step (called before each step)."""
        with self._lock:
            if self._busy_since is None:
                self._busy_since = time.monotonic()

    def idle(self) -> None:
        """The engine has nothing it can step now."""
        with self._lock:
            self._busy_since = None

    def step_finished(self, failed: bool | None) -> None:
        """A step ended; `failed` says whether its forward failed (None: it ran none)."""
        with self._lock:
            self._last_step_done = time.monotonic()
            self._last_step_at = time.time()
            if failed is None:
                return
            if failed:
                self._failed_in_a_row += 1
                self._failures.append(self._last_step_done)
            else:
                self._failed_in_a_row = 0

    @property
    def failing(self) -> bool:
        """Unhealthy because steps failed: only a successful step clears it."""
        with self._lock:
            return self._failed_in_a_row >= self.settings.max_failed_steps

    def report(self, draining: bool = False) -> HealthReport:
        now = time.monotonic()
        with self._lock:
            while self._failures and self._failures[0] < now - FAILURE_WINDOW_S:
                self._failures.popleft()
            reason = unhealthy_reason(self._failed_in_a_row, self._busy_since, self._last_step_done, now, self.settings)
            return HealthReport(not reason, reason, self._last_step_at, len(self._failures), draining)
