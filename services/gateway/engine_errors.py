"""The errors this gateway saw from each engine lately, for routing to weigh (routing.py).

An error counts for `window_s` seconds, or until the engine next completes a request: an
engine that serves again has shown it works. Failures are kept per engine up to a bound,
so an engine failing thousands of requests costs no more memory than one failing a few.
"""

from collections import deque

# failures remembered per engine: beyond this many, more make no difference to routing
MAX_REMEMBERED = 64


class RecentErrors:
    def __init__(self, window_s: float):
        if window_s <= 0:
            raise ValueError(f"the error window must be positive, got {window_s}")
        self.window_s = window_s
        self._failures: dict[str, deque[float]] = {}  # engine id -> when it failed, oldest first

    def failed(self, engine_id: str, now: float) -> None:
        self._failures.setdefault(engine_id, deque(maxlen=MAX_REMEMBERED)).append(now)

    def served(self, engine_id: str) -> None:
        self._failures.pop(engine_id, None)

    def counts(self, now: float) -> dict[str, int]:
        """Per engine id, its failures within the window (engines without any are left out)."""
        for engine_id, times in list(self._failures.items()):
            while times and times[0] <= now - self.window_s:
                times.popleft()
            if not times:
                del self._failures[engine_id]
        return {engine_id: len(times) for engine_id, times in self._failures.items()}

    def retain(self, engine_ids: set[str]) -> None:
        """Forget engines that left the registry."""
        for engine_id in set(self._failures) - engine_ids:
            del self._failures[engine_id]
