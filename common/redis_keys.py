"""The Redis keys shared by the gateway (writer) and the operator (reader).

Every key starts with the release name so that two installs can share one Redis.
Per-pool request counts live in one counter per epoch second:

    {release}:qps:{pool}:{epoch_second}   integer, expires after BUCKET_TTL_S

The gateway adds to the current second's bucket for every request it routes to a pool,
and at least once a second per pool even when idle (`count=0`), so that a quiet pool
reads as 0 QPS rather than as missing data. Several gateways add to the same buckets.
Beside it, the outcomes of the requests that finished in that second:

    {release}:stats:{pool}:{epoch_second}  hash: completed, errors, latency_s_sum

Engines register themselves with a heartbeat:

    {release}:engine:{engine_id}          JSON object, expires after the engine's TTL

The engine rewrites it every second or so; a key that has expired is an engine that is
gone. `live_engines` is how a gateway reads them all.
"""

import json
import math
from dataclasses import dataclass

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


def engine_key(release: str, engine_id: str) -> str:
    return f"{release}:engine:{engine_id}"


def register_engine(redis, release: str, engine_id: str, entry: dict, ttl_s: float) -> None:
    """Write (or refresh) an engine's registry entry; it disappears `ttl_s` after the last write."""
    redis.set(engine_key(release, engine_id), json.dumps(entry), px=max(1, int(ttl_s * 1000)))


def unregister_engine(redis, release: str, engine_id: str) -> None:
    redis.delete(engine_key(release, engine_id))


def live_engines(redis, release: str) -> dict[str, dict]:
    """Every engine whose heartbeat has not expired: engine_id -> its registry entry."""
    prefix = engine_key(release, "")
    keys = sorted(redis.scan_iter(match=prefix + "*", count=1000))
    if not keys:
        return {}
    engines = {}
    for key, value in zip(keys, redis.mget(keys)):
        if value is None:  # expired between SCAN and MGET
            continue
        try:
            entry = json.loads(value)
        except ValueError:
            continue
        if isinstance(entry, dict):
            name = key.decode() if isinstance(key, bytes) else key
            engines[name[len(prefix) :]] = entry
    return engines


def stats_key(release: str, pool: str, epoch_second: int) -> str:
    return f"{release}:stats:{pool}:{epoch_second}"


def record_outcomes(pipe, release: str, pool: str, epoch_second: int, completed: int, errors: int, latency_s_sum: float) -> None:
    """Add finished requests to a pool's per-second outcome hash: how many completed, how many
    of them failed, and their summed end-to-end latency (mean = latency_s_sum / completed)."""
    key = stats_key(release, pool, epoch_second)
    pipe.hincrby(key, "completed", completed)
    pipe.hincrby(key, "errors", errors)
    pipe.hincrbyfloat(key, "latency_s_sum", latency_s_sum)
    pipe.expire(key, BUCKET_TTL_S)
