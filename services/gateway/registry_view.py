"""The gateway's copy of the engine registry, refreshed from Redis in the background.

When Redis cannot be read the gateway keeps routing with the last engines it saw (their
own connections tell it if one of them dies) and reports the outage in /readyz and the log.
"""

import asyncio
import logging
import time

import redis

from k25.redis_keys import live_engines
from services.gateway.routing import EngineView

log = logging.getLogger(__name__)


class RegistryView:
    def __init__(self, client: redis.Redis, release: str):
        self.client = client
        self.release = release
        self.engines: list[EngineView] = []
        self.redis_ok: bool | None = None  # None until the first read
        self.last_read_at: float | None = None

    async def refresh(self) -> None:
        try:
            entries = await asyncio.to_thread(live_engines, self.client, self.release)
        except redis.RedisError as exc:
            if self.redis_ok is not False:
                log.warning("registry Redis unreachable (%s); routing with the last %d engines seen", exc, len(self.engines))
            self.redis_ok = False
            return
        if self.redis_ok is False:
            log.info("registry Redis is back: %d engines", len(entries))
        views = [EngineView.from_entry(engine_id, entry) for engine_id, entry in entries.items()]
        broken = [engine_id for engine_id, view in zip(entries, views) if view is None]
        if broken:
            log.warning("ignoring unreadable registry entries: %s", ", ".join(broken))
        self.engines = [v for v in views if v is not None]
        self.redis_ok = True
        self.last_read_at = time.time()
