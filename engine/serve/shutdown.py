"""SIGTERM and SIGINT as the engine's serving loop reads them: the first asks it to drain, a
second one (during the drain) to stop waiting for the running requests.

The handler only counts: Python runs it on the main thread between two bytecodes, wherever
that thread is, so it must not take a lock that thread may hold (as logging and
threading.Event do)."""

import signal


class ShutdownSignals:
    def __init__(self):
        self.received = 0

    def install(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._count)

    def _count(self, signum, frame) -> None:
        self.received += 1

    def is_set(self) -> bool:
        """A stop was asked for: the serving loop ends and the drain begins."""
        return self.received >= 1

    def hurry(self) -> bool:
        """Asked twice: the drain stops waiting for the running requests."""
        return self.received >= 2
