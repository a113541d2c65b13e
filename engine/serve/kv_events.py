"""Telling gateways what the prefix cache gained and lost, so that they can send a prompt to
the engine that holds its prefix (the channel and message: common/redis_keys.py, KVEvents).

The serving thread hands each step's changes to `add` (a list append under a lock); a daemon
thread publishes what gathered every `interval_s` as one message. Redis stays off the token
path: when it is down the changes are dropped, and the first message after it is back says
`cleared`, so gateways forget this engine's older hashes instead of trusting a stale picture.
The first message of every start says `cleared` too (a restarted engine's cache is empty)."""

import logging
import threading

import redis

from common.redis_keys import kv_events_channel
from proto import k25_pb2

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 0.05
# hashes waiting beyond which they are dropped (and gateways told to forget): a bound on memory
# while Redis is slow or down
MAX_PENDING = 200_000


class KVEventPublisher:
    def __init__(self, client: redis.Redis, release: str, engine_id: str, incarnation: str,
                 interval_s: float = DEFAULT_INTERVAL_S, max_pending: int = MAX_PENDING):
        self.client = client
        self.channel = kv_events_channel(release)
        self.engine_id = engine_id
        self.incarnation = incarnation
        self.interval_s = interval_s
        self.max_pending = max_pending
        self.published = 0  # messages Redis took
        self._lock = threading.Lock()
        self._stored: list[int] = []
        self._removed: list[int] = []
        self._cleared = True
        self._redis_down = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def add(self, stored: list[int], removed: list[int]) -> None:
        with self._lock:
            if len(self._stored) + len(self._removed) + len(stored) + len(removed) > self.max_pending:
                self._stored, self._removed, self._cleared = [], [], True
                return
            self._stored += stored
            self._removed += removed

    def publish_pending(self) -> bool:
        """Publish what gathered as one message; False if Redis did not take it."""
        with self._lock:
            if not (self._stored or self._removed or self._cleared):
                return True
            message = k25_pb2.KVEvents(engine_id=self.engine_id, incarnation=self.incarnation, cleared=self._cleared,
                                       stored=self._stored, removed=self._removed)
            self._stored, self._removed, self._cleared = [], [], False
        try:
            self.client.publish(self.channel, message.SerializeToString())
        except redis.RedisError as exc:
            if not self._redis_down:
                log.warning("kv events: Redis unreachable (%s); dropping cache events until it is back", exc)
            self._redis_down = True
            with self._lock:
                self._stored, self._removed, self._cleared = [], [], True
            return False
        self._redis_down = False
        self.published += 1
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.publish_pending()

    def stop(self) -> None:
        """Stop, telling gateways to forget this engine's hashes."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval_s + 5)
        with self._lock:
            self._stored, self._removed, self._cleared = [], [], True
        self.publish_pending()
