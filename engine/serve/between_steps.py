"""Calls that other threads hand to the engine's serving thread, which runs them between two
engine steps: only that thread ever changes the engine (e.g. loads or unloads an adapter)."""

import queue
from collections.abc import Callable
from concurrent.futures import Future


class CallsBetweenSteps:
    def __init__(self):
        self._calls: queue.SimpleQueue[tuple[Callable, Future]] = queue.SimpleQueue()

    def put(self, fn: Callable[[], object]) -> Future:
        """Queue `fn` from any thread; the future holds its result or exception once it ran."""
        future: Future = Future()
        self._calls.put((fn, future))
        return future

    def run(self) -> None:
        """Run the queued calls until none is left (on the serving thread)."""
        while True:
            try:
                fn, future = self._calls.get_nowait()
            except queue.Empty:
                return
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except Exception as exc:
                    future.set_exception(exc)

    def cancel(self) -> None:
        """Calls that will never run: their callers stop waiting."""
        while True:
            try:
                _, future = self._calls.get_nowait()
            except queue.Empty:
                return
            future.cancel()
