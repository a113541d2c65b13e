"""The Redis keys shared by the gateway, the engines and the operator.

Every key starts with the release name so that two installs can share one Redis.
Per-pool request counts live in one counter per epoch second:

    {release}:qps:{pool}:{epoch_second}   integer, expires after BUCKET_TTL_S

The gateway adds to the current second's bucket for every request it routes to a pool,
and at least once a second per pool even when idle (`count=0`), so that a quiet pool
reads as 0 QPS rather than as missing data. Several gateways add to the same buckets.

Engines register themselves with a heartbeat, in one structure per release:

    {release}:engines                     hash: engine_id -> its JSON registry entry
    {release}:engines:expiry              sorted set: engine_id scored by when its entry
                                          expires (Redis' clock, epoch milliseconds)

The engine rewrites its entry every second or so (`register_engine`), pushing its expiry
one TTL ahead; an entry whose expiry has passed is an engine that is gone. Gateways read
the registry twice a second each, so it is read in one call (`live_engines`), never by
SCANning a keyspace that grows with the per-second buckets. Both writes and reads are
small Lua scripts, so that:
- the entry and its expiry change together (a reader never sees one without the other);
- expiry is judged by Redis' own clock, as a key's TTL was, never by the clocks of the
  engine and gateway hosts;
- a read removes the entries it finds expired (as does a write, so the hash stays small
  without readers too), and both keys expire with the longest-lived entry, so a release
  whose engines all stopped leaves nothing behind.
Engines announce what their prefix caches hold on one pub/sub channel per release:

    {release}:kv_events                   channel: KVEvents messages (proto/k25.proto)

Each message names the engine and its incarnation and lists the block hashes it cached and
evicted since its last message (common/prefix_hash.py); `cleared` says to forget everything
heard from that engine before. Gateways keep what they hear as a routing hint: a message
lost costs a cache miss, never a wrong answer.

The sorted set decides who is live; the hash only holds what they said (a hash cannot
expire its fields before Redis 7.4, hence the set beside it). Scripts that write after
reading the clock need Redis 5 or later (effects replication).
"""

import json
import math
from dataclasses import dataclass

# The most a registry entry may claim; a reader ignores (and logs) an entry beyond them, so
# that one broken or compromised engine cannot make every gateway pad a prompt to 2**31 tokens,
# keep it for hours after an outage, or draw all traffic with an absurd free KV figure.
ENTRY_LIMITS = {
    "chunk_size": 1 << 21,  # tokens: the longest context any pool serves today is far below
    "max_model_len": 1 << 21,
    "block_size": 1 << 21,
    "max_waiting": 1 << 20,
    "running": 1 << 20,
    "waiting": 1 << 20,
    "step_failures": 1 << 31,
    "capacity_tokens": 1 << 40,
    "heartbeat_ttl_s": 300.0,
    "ttft_p95_s": 86400.0,
    "adapters": 4096,  # adapter versions an entry lists
    "text": 256,  # characters of the address, pool, model, incarnation and each adapter name
}

def within_limit(entry: dict, name: str, kind: type = int) -> float | int | None:
    """An entry's number `name` when it is a `kind` (int, or any real number for float) in
    [0, ENTRY_LIMITS[name]]; None otherwise (absent, a bool, NaN, negative, absurd)."""
    value = entry.get(name)
    numbers = (int,) if kind is int else (int, float)
    if isinstance(value, bool) or not isinstance(value, numbers) or not 0 <= value <= ENTRY_LIMITS[name]:
        return None
    return value


# long enough for the operator's look-back, short enough that Redis stays small
BUCKET_TTL_S = 300
# how far back `pool_qps` looks for the newest bucket when telling "stale" from "missing"
LOOKBACK_S = 120


def qps_bucket_key(release: str, pool: str, epoch_second: int) -> str:
    return f"{release}:qps:{pool}:{epoch_second}"


def record_requests(pipe, release: str, pool: str, now: float, count: int = 1) -> None:
    """Count `count` requests to `pool` at time `now` (epoch seconds) on a Redis pipeline
    (or client); the caller executes the pipeline. `count=0` marks the pool as reporting."""
    if count < 0:
        raise ValueError(f"request count must not be negative, got {count}")
    key = qps_bucket_key(release, pool, math.floor(now))
    pipe.incrby(key, count)
    pipe.expire(key, BUCKET_TTL_S)


@dataclass(frozen=True)
class QpsReading:
    qps: float | None  # mean over the complete seconds of the window; None: no bucket there
    newest_bucket_age_s: float | None  # now minus the newest bucket's second; None: none at all


def pool_qps(redis, release: str, pool: str, now: float, window_s: int = 10) -> QpsReading:
    """The pool's request rate over the last `window_s` complete seconds before `now`.

    Seconds without a bucket in the window are left out of the mean (a gateway that has just
    started has not written them yet); when none is there, `qps` is None and the age of the
    newest bucket in the look-back says how stale the data is."""
    if window_s < 1:
        raise ValueError(f"window_s must be at least 1, got {window_s}")
    current = math.floor(now)
    lookback = max(window_s, LOOKBACK_S)
    seconds = [current - back for back in range(1, lookback + 1)]  # newest first
    values = redis.mget([qps_bucket_key(release, pool, s) for s in seconds])
    present = [(s, int(v)) for s, v in zip(seconds, values) if v is not None]
    # the current second is still being written; it only counts for freshness
    if redis.exists(qps_bucket_key(release, pool, current)):
        newest = current
    else:
        newest = present[0][0] if present else None
    in_window = [count for s, count in present if s >= current - window_s]
    return QpsReading(
        qps=sum(in_window) / len(in_window) if in_window else None,
        newest_bucket_age_s=None if newest is None else max(0.0, now - newest),
    )


# KEYS: the entries hash, the expiry sorted set. Leaves `now_ms` (Redis' clock) defined and
# the entries that expired by then removed from both.
_PRUNE = """
local clock = redis.call('TIME')
local now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
for _, engine_id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now_ms)) do
    redis.call('HDEL', KEYS[1], engine_id)
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms)
"""

# ARGV: engine_id, its JSON entry, its TTL in milliseconds
_REGISTER = _PRUNE + """
local ttl_ms = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], now_ms + ttl_ms, ARGV[1])
if redis.call('PTTL', KEYS[1]) < ttl_ms then
    redis.call('PEXPIRE', KEYS[1], ttl_ms)
    redis.call('PEXPIRE', KEYS[2], ttl_ms)
end
"""

# returns engine_id, entry, engine_id, entry, ... for every entry not expired
_LIVE = _PRUNE + """
local live = {}
for _, engine_id in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    local entry = redis.call('HGET', KEYS[1], engine_id)
    if entry then
        live[#live + 1] = engine_id
        live[#live + 1] = entry
    end
end
return live
"""


def kv_events_channel(release: str) -> str:
    return f"{release}:kv_events"


def engines_key(release: str) -> str:
    return f"{release}:engines"


def engines_expiry_key(release: str) -> str:
    return f"{release}:engines:expiry"


def register_engine(redis, release: str, engine_id: str, entry: dict, ttl_s: float) -> None:
    """Write (or refresh) an engine's registry entry; it disappears `ttl_s` after the last write."""
    keys = [engines_key(release), engines_expiry_key(release)]
    redis.register_script(_REGISTER)(keys=keys, args=[engine_id, json.dumps(entry), max(1, int(ttl_s * 1000))])


def unregister_engine(redis, release: str, engine_id: str) -> None:
    pipe = redis.pipeline(transaction=True)
    pipe.hdel(engines_key(release), engine_id)
    pipe.zrem(engines_expiry_key(release), engine_id)
    pipe.execute()


def live_engines(redis, release: str) -> dict[str, dict]:
    """Every engine whose heartbeat has not expired: engine_id -> its registry entry, in
    engine_id order. Entries that are not JSON objects, or whose id is not UTF-8 text, are left out."""
    flat = redis.register_script(_LIVE)(keys=[engines_key(release), engines_expiry_key(release)])
    engines = {}
    for engine_id, value in zip(flat[::2], flat[1::2]):
        try:
            entry, engine_id = json.loads(value), _text(engine_id)
        except ValueError:  # UnicodeDecodeError is one
            continue
        if isinstance(entry, dict):
            engines[engine_id] = entry
    return dict(sorted(engines.items()))


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value
