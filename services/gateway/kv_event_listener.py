"""A daemon thread that feeds the engines' KV events (the Redis channel {release}:kv_events)
into the gateway's PrefixIndex.

A message that cannot be read is counted, logged once in a while, and skipped. When Redis
is unreachable the thread logs it once and subscribes again every `retry_s`; what was
announced meanwhile is lost, which costs cache misses, never wrong answers."""

import logging
import threading

import redis
from google.protobuf.message import DecodeError

from common.redis_keys import kv_events_channel
from proto import k25_pb2
from services.gateway.prefix_index import PrefixIndex

log = logging.getLogger(__name__)

LOG_EVERY_UNREADABLE = 1000


class KVEventListener:
    def __init__(self, client: redis.Redis, release: str, index: PrefixIndex, retry_s: float = 1.0):
        self.client = client
        self.channel = kv_events_channel(release)
        self.index = index
        self.retry_s = retry_s
        self.applied = 0
        self.unreadable = 0
        self._redis_down = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-event-listener", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.retry_s + 5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._listen()
            except redis.RedisError as exc:
                if not self._redis_down:
                    log.warning("KV events: Redis unreachable (%s); routing on what is known, subscribing again", exc)
                self._redis_down = True
                self._stop.wait(self.retry_s)

    def _listen(self) -> None:
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        try:
            pubsub.subscribe(self.channel)
            if self._redis_down:
                log.info("KV events: subscribed again")
            self._redis_down = False  # each outage is logged once, not only the first
            while not self._stop.is_set():
                message = pubsub.get_message(timeout=0.5)
                if message is not None:
                    self.handle(message["data"])
                while not self.index.sweep():  # the lock is free between slices
                    pass
        finally:
            pubsub.close()

    def handle(self, data: bytes) -> None:
        try:
            event = k25_pb2.KVEvents.FromString(data)
        except (DecodeError, TypeError) as exc:
            self.unreadable += 1
            if self.unreadable % LOG_EVERY_UNREADABLE == 1:
                log.warning("KV events: skipped an unreadable message (%s); %d so far", exc, self.unreadable)
            return
        if not event.engine_id:
            self.unreadable += 1
            return
        self.index.apply(event)
        self.applied += 1
