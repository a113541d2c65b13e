"""A daemon thread that keeps an engine's registry entry alive in Redis.

Redis is the control plane, never the token path: when it is down the engine keeps
serving, logs that once, and writes again as soon as Redis answers."""

import logging
import threading
from collections.abc import Callable

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from common.redis_keys import register_engine, unregister_engine

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 1.0
DEFAULT_TTL_S = 5.0


def registry_client(url: str, timeout_s: float = 2.0) -> redis.Redis:
    """A client that fails fast: the heartbeat retries on its own clock, not inside one beat."""
    return redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 0))


class Heartbeat:
    def __init__(
        self,
        client: redis.Redis,
        release: str,
        engine_id: str,
        entry: Callable[[], dict],
        interval_s: float = DEFAULT_INTERVAL_S,
        ttl_s: float = DEFAULT_TTL_S,
    ):
        if ttl_s <= interval_s:
            raise ValueError(f"heartbeat TTL ({ttl_s} s) must be longer than its interval ({interval_s} s)")
        self.client = client
        self.release = release
        self.engine_id = engine_id
        self.entry = entry
        self.interval_s = interval_s
        self.ttl_s = ttl_s
        self.redis_down = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def beat(self) -> bool:
        """Write the entry once; False (logged on the first failure only) if Redis did not take it."""
        try:
            register_engine(self.client, self.release, self.engine_id, self.entry(), self.ttl_s)
        except redis.RedisError as exc:
            if not self.redis_down:
                log.warning("heartbeat: Redis unreachable (%s); serving on and retrying every %.1f s", exc, self.interval_s)
            self.redis_down = True
            return False
        if self.redis_down:
            log.info("heartbeat: Redis is back; engine %s registered again", self.engine_id)
        self.redis_down = False
        return True

    def _run(self) -> None:
        while True:
            self.beat()
            if self._stop.wait(self.interval_s):
                return

    def stop(self) -> None:
        """Stop beating and remove the entry, so gateways stop routing here at once."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval_s + 5)
        try:
            unregister_engine(self.client, self.release, self.engine_id)
        except redis.RedisError as exc:
            log.warning("heartbeat: could not remove %s from Redis (%s); it expires in %.0f s", self.engine_id, exc, self.ttl_s)
