"""Telling gateways what the prefix cache gained and lost, so that they can send a prompt to
the engine that holds its prefix (the channel and message: common/redis_keys.py, KVEvents).

The serving thread hands each step's changes to `add` (block hash -> the highest tier that holds
it now, under a lock); a daemon thread publishes what gathered every `interval_s` as one
message, each hash in its latest state. Redis stays off the token
path: when it is down the changes are dropped, and the first message after it is back says
`cleared`, so gateways forget this engine's older hashes instead of trusting a stale picture.
The first message of every start says `cleared` too (a restarted engine's cache is empty)."""

import logging
import threading
from collections.abc import Mapping

import redis

from common.redis_keys import kv_events_channel
from engine.core.contract import DEVICE, DISK, HOST
from proto import k25_pb2

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 0.05
# changed hashes waiting beyond which they are dropped (and gateways told to forget): a bound on memory
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
        self._pending: dict[int, str | None] = {}  # block hash -> its highest tier now, None: none
        self._cleared = True
        self._redis_down = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def add(self, changes: Mapping[int, str | None]) -> None:
        """A step's changes (StepResult.kv_events), applied over those not yet published."""
        with self._lock:
            self._pending.update(changes)
            if len(self._pending) > self.max_pending:
                self._pending, self._cleared = {}, True

    def publish_pending(self) -> bool:
        """Publish what gathered as one message; False if Redis did not take it."""
        with self._lock:
            if not (self._pending or self._cleared):
                return True
            message = kv_events_message(self.engine_id, self.incarnation, self._cleared, self._pending)
            self._pending, self._cleared = {}, False
        try:
            self.client.publish(self.channel, message.SerializeToString())
        except redis.RedisError as exc:
            if not self._redis_down:
                log.warning("kv events: Redis unreachable (%s); dropping cache events until it is back", exc)
            self._redis_down = True
            with self._lock:
                self._pending, self._cleared = {}, True
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
            self._pending, self._cleared = {}, True
        self.publish_pending()


def kv_events_message(engine_id: str, incarnation: str, cleared: bool, changes: Mapping[int, str | None]) -> k25_pb2.KVEvents:
    """The wire form of `changes` (proto/k25.proto KVEvents): a hash not on the device is in
    `removed`, and also in `host` or `disk` when a tier below holds it."""
    by_tier: dict[str | None, list[int]] = {DEVICE: [], HOST: [], DISK: [], None: []}
    for h, tier in changes.items():
        by_tier[tier].append(h)
    return k25_pb2.KVEvents(engine_id=engine_id, incarnation=incarnation, cleared=cleared, stored=by_tier[DEVICE],
                            removed=by_tier[HOST] + by_tier[DISK] + by_tier[None], host=by_tier[HOST], disk=by_tier[DISK])
