"""A latency percentile over the last few seconds, for the heartbeat: the autoscaler's
latency guard reads what users wait now, not since the engine started (its Prometheus
histogram holds that)."""

import math
from collections import deque


class RecentPercentile:
    """The `quantile` of the values added in the last `window_s` seconds; at most `max_samples`
    are kept (the newest), so a burst costs bounded memory and work."""

    def __init__(self, quantile: float = 0.95, window_s: float = 60.0, max_samples: int = 2048):
        if not 0 < quantile <= 1 or window_s <= 0 or max_samples < 1:
            raise ValueError(f"need 0 < quantile <= 1, window_s > 0 and max_samples >= 1, got {quantile}, "
                             f"{window_s}, {max_samples}")
        self.quantile, self.window_s = quantile, window_s
        self._samples: deque[tuple[float, float]] = deque(maxlen=max_samples)  # (time, value), oldest first
        self._cached: float | None = None
        self._stale = False

    def add(self, now: float, value: float) -> None:
        self._samples.append((now, value))
        self._stale = True

    def value(self, now: float) -> float | None:
        """The percentile (nearest rank) of the window's values; None when it holds none."""
        while self._samples and self._samples[0][0] <= now - self.window_s:
            self._samples.popleft()
            self._stale = True
        if self._stale:
            ordered = sorted(v for _, v in self._samples)
            self._cached = ordered[math.ceil(self.quantile * len(ordered)) - 1] if ordered else None
            self._stale = False
        return self._cached
