"""The gateway's copy of the engine registry, refreshed from Redis in the background.

When Redis cannot be read the gateway keeps routing with the last engines it saw (their
own connections tell it if one of them dies) and reports the outage in /readyz and the log.
A Redis that comes back may have lost every key: engines seen before the outage stay in the
view for one heartbeat TTL after it (each its own, as its last entry said), the time they
have to register again.

An entry that cannot be read or claims values out of bounds (routing.py `out_of_bounds`) is
ignored, and so is a rollout index member whose name or hash breaks the contract: that
adapter keeps its last good state, the others change as Redis says. Each is logged when it
first appears (or its reason changes), not at every refresh.

It also keeps the pools the gateway knows of: those its settings name, and every pool an
engine has registered in, also once its engines are gone (a pool scaled to zero is still a
pool that demand can wake), for `LEARNED_POOL_TTL_S` after its last engine was seen and at
most `MAX_LEARNED_POOLS` of them: entries made up by a broken or hostile writer cannot grow the
gateway's pools (and the QPS buckets it writes for each) without bound.
"""

import asyncio
import contextlib
import logging
import time

import redis

from common.redis_keys import live_engines
from common.rollout_keys import RolloutState, read_each_rollout
from services.gateway.routing import EngineView, PoolInfo, known_pools

log = logging.getLogger(__name__)

LEARNED_POOL_TTL_S = 3600.0
MAX_LEARNED_POOLS = 256


def learned_pools_kept(last_seen: dict[str, float], now: float, ttl_s: float, limit: int) -> dict[str, float]:
    """The learned pools (name -> when an engine of it was last seen) still remembered at `now`:
    those seen within `ttl_s`, the `limit` most recently seen."""
    recent = sorted(((seen, name) for name, seen in last_seen.items() if now - seen <= ttl_s), reverse=True)
    return {name: seen for seen, name in recent[:limit]}


class RegistryView:
    def __init__(self, client: redis.Redis, release: str, pools: tuple[tuple[str, int], ...] = ()):
        """`pools`: (name, chunk_size) of the pools the settings name."""
        self.client = client
        self.release = release
        self._recovered_at: float | None = None  # when Redis last came back after an outage
        self._refreshed = asyncio.Event()  # set (and replaced) by every refresh
        self.engines: list[EngineView] = []
        self._configured = {name: PoolInfo(name, chunk_size) for name, chunk_size in pools}
        self._learned: dict[str, PoolInfo] = {}
        self._learned_seen: dict[str, float] = {}  # learned pool -> when one of its engines was last seen
        self.pools: dict[str, PoolInfo] = dict(self._configured)
        self.rollouts: dict[str, RolloutState] = {}  # adapter -> its rollout state
        self.redis_ok: bool | None = None  # None until the first read
        self.last_read_at: float | None = None
        self.ignored: dict[str, str] = {}  # what the last read ignored ("engine X" or "rollout Y") and why

    async def wait_for_refresh(self, timeout_s: float) -> None:
        """Return after the next refresh, or after `timeout_s`, whichever comes first."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, timeout_s)):  # not wait_for: it can drop a cancel (engine_client.py)
                await self._refreshed.wait()

    async def refresh(self) -> None:
        try:
            await self._refresh()
        finally:
            self._refreshed.set()
            self._refreshed = asyncio.Event()

    async def _refresh(self) -> None:
        try:
            entries, rollouts, broken_rollouts = await asyncio.to_thread(self._read)
        except redis.RedisError as exc:
            if self.redis_ok is not False:
                log.warning("registry Redis unreachable (%s); routing with the last %d engines seen", exc, len(self.engines))
            self.redis_ok = False
            return
        now = time.time()
        if self.redis_ok is False:
            log.info("registry Redis is back: %d engines", len(entries))
            self._recovered_at = now
        judged = {engine_id: EngineView.judge(engine_id, entry) for engine_id, entry in entries.items()}
        ignored = {f"engine {engine_id}": why for engine_id, why in judged.items() if isinstance(why, str)}
        self._report({**ignored, **{f"rollout {name}": why for name, why in broken_rollouts.items()}})
        fresh = [v for v in judged.values() if isinstance(v, EngineView)]
        if self._recovered_at is not None:
            fresh_ids = {v.engine_id for v in fresh}
            fresh += [e for e in self.engines
                      if e.engine_id not in fresh_ids and now < self._recovered_at + e.heartbeat_ttl_s]
        self.engines = fresh
        self._learn_pools(known_pools(fresh), now)
        self.rollouts = rollouts
        self.redis_ok = True
        self.last_read_at = now

    def _learn_pools(self, seen: list[PoolInfo], now: float) -> None:
        for pool in seen:
            self._learned[pool.name] = pool
            self._learned_seen[pool.name] = now
        self._learned_seen = learned_pools_kept(self._learned_seen, now, LEARNED_POOL_TTL_S, MAX_LEARNED_POOLS)
        self._learned = {name: self._learned[name] for name in self._learned_seen}
        # a pool the settings name keeps its place; engines in it tell its context length
        self.pools = {**self._configured, **self._learned}

    def _read(self) -> tuple[dict, dict[str, RolloutState], dict[str, str]]:
        entries = live_engines(self.client, self.release)
        states, broken = read_each_rollout(self.client, self.release)
        kept = {name: self.rollouts[name] for name in broken if name in self.rollouts}  # its last good state
        return entries, dict(sorted({**states, **kept}.items())), broken

    def _report(self, ignored: dict[str, str]) -> None:
        for what, why in ignored.items():
            if self.ignored.get(what) != why:
                log.warning("registry: ignoring %s: %s", what, why)
        self.ignored = ignored
