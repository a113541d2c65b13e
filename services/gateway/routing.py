"""Where a request goes: the pool by prompt length, the engine by free KV. Pure functions.

A pool is the set of live engines that registered the same pool name. A request fits a
pool when its prompt plus `max_tokens` is within the pool's context (`max_model_len`).
Among the pools it fits, the preferred one is the smallest `chunk_size` that holds the
whole prompt in one chunk (least padding); a prompt longer than every chunk goes to the
largest `chunk_size` (fewest chunks). Within a pool, engines are ordered by free KV (in
steps of 5%, most first; the heartbeat's figure less the prompt tokens this gateway sent
there that have no first token yet, since the heartbeat is up to a second old), then by
load (running and waiting as last reported, plus this gateway's own requests open on it,
which are fresher), then by a turn that rotates with every request, so that idle engines
share the work instead of the first one taking it all.
When some engine's prefix cache holds part of the prompt (`cached_share`, from the
gateway's prefix index: the share of the prompt's prefill it saves, blocks held in host
memory or on disk counting less than those on the device, held_prefix.py), load decides
instead, less CACHE_AFFINITY_REQUESTS times the chunks of the prompt each engine holds (its
share times the prompt's length in chunks, at least one): questions about one document go
where its KV is, until that engine has more requests than another by what the document's
prefill would cost the other (a 2,000-token document in 256-token chunks: about 31 requests;
a prompt of one chunk: 4), when the other takes them (and caches the document too). Load counts, besides requests, the prefill this
gateway sent an engine that has not produced a first token yet, QUEUED_CHUNK_REQUESTS a
chunk: a queued document weighs what its prefill costs, not one request, so that new
documents go to the engine with the least of them queued. That queued prefill weighs on a
request in proportion to the part of its prompt the engine does not hold: engines admit
the waiting request with the fewest tokens left to compute first (engine/core/admission_order.py),
so a question whose document an engine holds goes ahead of the documents queued there.
Those whose last heartbeat reported them past their KV admission limit or with their queue
full come last rather than not at all, since a heartbeat is up to a second old and the
engine's own admission check is the one that counts (a refusal costs one round trip). Both
limits are the engine's own, from its heartbeat: the gateway keeps no copy of them.

Health: an engine whose entry says it is unhealthy or draining is never chosen (it refuses
new work anyway). One with recent errors (those this gateway saw from it, plus the failed
steps it reports) comes after every engine without, fewest errors first: an engine that
fails every request at once would otherwise look idle and draw all the traffic. It is
still tried when nothing else takes the request, since its errors may have passed.

Pools without engines: the gateway knows pools from its settings and from every engine it
has seen (PoolInfo). A request's demand counts against the pool it prefers among those
(`preferred_pool`), live or not, so that a pool scaled to zero is woken by its own demand.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from common.redis_keys import ENTRY_LIMITS

# free KV is compared in steps of 1/KV_STEPS: within a step, load decides
KV_STEPS = 20
# what holding one chunk of a prompt's prefix is worth, in requests of load: an engine that
# holds a whole one-chunk prompt is preferred until it has this many more requests than one
# that does not, one that holds a longer prompt in proportion to the prefill it saves
CACHE_AFFINITY_REQUESTS = 4
# what one chunk of prefill queued on an engine (sent by this gateway, no first token yet)
# weighs, in requests of load: half what a chunk found cached is worth, since a chunk computed
# again elsewhere costs twice, the request's own wait and the engine time it takes from others
QUEUED_CHUNK_REQUESTS = CACHE_AFFINITY_REQUESTS / 2


@dataclass(frozen=True)
class EngineView:
    """One live engine as its registry entry describes it."""

    engine_id: str
    address: str
    pool: str
    model: str
    chunk_size: int
    max_model_len: int
    free_kv_fraction: float
    running: int
    waiting: int
    kv_admission_limit: float  # the engine refuses new requests above this KV use
    max_waiting: int  # ... and while this many are queued
    heartbeat_ttl_s: float  # how long its entry outlives its last refresh
    adapters: tuple[str, ...] = ()
    block_size: int = 0  # tokens per KV block, the unit of its prefix-cache hashes; 0: no prefix cache
    incarnation: str = ""  # changes when the engine restarts (and its cache empties)
    healthy: bool = True  # false: its steps are failing, it refuses new work
    draining: bool = False  # true: it is shutting down, it refuses new work
    step_failures: int = 0  # its recently failed steps, as it reports them
    capacity_tokens: int = 0  # its KV cache in tokens; 0: not reported

    @property
    def routable(self) -> bool:
        return self.healthy and not self.draining

    @classmethod
    def from_entry(cls, engine_id: str, entry: dict) -> "EngineView | None":
        """None for an entry that lacks a field, has one of the wrong type or a value out of
        range (an engine too old to report its limits included): a broken heartbeat must not
        take routing down, and an engine is judged by its own limits or not at all."""
        judged = cls.judge(engine_id, entry)
        return judged if isinstance(judged, EngineView) else None

    @classmethod
    def judge(cls, engine_id: str, entry: dict) -> "EngineView | str":
        """The view of a registry entry, or why it is ignored."""
        try:
            view = cls(
                engine_id=engine_id,
                address=str(entry["address"]),
                pool=str(entry["pool"]),
                model=str(entry["model"]),
                chunk_size=int(entry["chunk_size"]),
                max_model_len=int(entry["max_model_len"]),
                free_kv_fraction=float(entry["free_kv_fraction"]),
                running=int(entry.get("running", 0)),
                waiting=int(entry.get("waiting", 0)),
                kv_admission_limit=float(entry["kv_admission_limit"]),
                max_waiting=int(entry["max_waiting"]),
                heartbeat_ttl_s=float(entry["heartbeat_ttl_s"]),
                adapters=tuple(str(a) for a in entry.get("adapters", ())),
                block_size=int(entry.get("block_size", 0)) if entry.get("prefix_caching") else 0,
                incarnation=str(entry.get("incarnation", "")),
                # engines older than these fields are healthy and not draining
                healthy=_flag(entry, "healthy", True),
                draining=_flag(entry, "draining", False),
                step_failures=int(entry.get("step_failures") or 0),
                capacity_tokens=int(entry.get("capacity_tokens") or 0),
            )
        except KeyError as missing:
            return f"no {missing.args[0]}"
        except (TypeError, ValueError) as exc:
            return f"unreadable ({exc})"
        return out_of_bounds(view) or view


def out_of_bounds(view: EngineView) -> str | None:
    """What in a registry entry is out of its range (common/redis_keys.py ENTRY_LIMITS), or None."""
    floors = {"chunk_size": 1, "max_model_len": 1, "max_waiting": 0, "heartbeat_ttl_s": 1e-3, "block_size": 0,
              "step_failures": 0, "capacity_tokens": 0, "running": 0, "waiting": 0}
    for name, floor in floors.items():
        value = getattr(view, name)
        if not floor <= value <= ENTRY_LIMITS[name]:  # NaN fails too
            return f"{name} {value} is outside [{floor}, {ENTRY_LIMITS[name]}]"
    for name in ("kv_admission_limit", "free_kv_fraction"):
        if not 0.0 <= getattr(view, name) <= 1.0:
            return f"{name} {getattr(view, name)} is outside [0, 1]"
    if len(view.adapters) > ENTRY_LIMITS["adapters"]:
        return f"{len(view.adapters)} adapters listed, more than {ENTRY_LIMITS['adapters']}"
    texts = [view.address, view.pool, view.model, view.incarnation, *view.adapters]
    if any(len(text) > ENTRY_LIMITS["text"] for text in texts):
        return f"a name or address longer than {ENTRY_LIMITS['text']} characters"
    return None


@dataclass(frozen=True)
class PoolRoute:
    """One pool to try, with its engines in the order to try them."""

    pool: str
    chunk_size: int
    engines: tuple[EngineView, ...]


@dataclass(frozen=True)
class PoolInfo:
    """A pool the gateway knows of, with or without live engines."""

    name: str
    chunk_size: int
    max_model_len: int | None = None  # None: no engine of it seen yet (it came from the settings)


class Refusal(Enum):
    NO_ENGINES = "no_engines"  # no routable engine: 503
    NEVER_FITS = "never_fits"  # longer than every pool's context: 400 at once


@dataclass(frozen=True)
class RoutePlan:
    routes: tuple[PoolRoute, ...] = ()
    refusal: Refusal | None = None
    pool: str | None = None  # the preferred pool it fits among those with engines, even when it is full
    max_context: int = 0  # the largest context among live engines, for the error message
    errors: tuple[tuple[str, int], ...] = ()  # (engine id, recent errors) of those that have some


def plan_route(engines: list[EngineView], prompt_tokens: int, max_tokens: int,
               open_requests: dict[str, int] | None = None, turn: int = 0,
               cached_share: dict[str, float] | None = None, recent_errors: dict[str, int] | None = None,
               unprefilled_tokens: dict[str, int] | None = None) -> RoutePlan:
    """`open_requests`: this gateway's requests open per engine id; `turn`: a number that
    changes from one request to the next (it rotates the order of otherwise equal engines);
    `cached_share`: per engine id, the share of the prompt's prefill its KV tiers save (0..1,
    held_prefix.saved_share);
    `recent_errors`: per engine id, the errors this gateway saw from it lately;
    `unprefilled_tokens`: per engine id, prompt tokens this gateway sent there, not expected
    cached, that have no first token yet (prefill still to run)."""
    engines = [e for e in engines if e.routable]
    if not engines:
        return RoutePlan(refusal=Refusal.NO_ENGINES)
    errors = {e.engine_id: (recent_errors or {}).get(e.engine_id, 0) + e.step_failures for e in engines}
    errors = {engine_id: count for engine_id, count in errors.items() if count}
    needed = prompt_tokens + max_tokens
    pools: dict[str, list[EngineView]] = {}
    for engine in engines:
        pools.setdefault(engine.pool, []).append(engine)
    max_context = max(e.max_model_len for e in engines)

    routes = []
    for pool, members in pools.items():
        chunk_size = pool_chunk_size(members)
        fitting = [e for e in members if e.max_model_len >= needed and e.chunk_size == chunk_size]
        if not fitting:
            continue
        ids = sorted(e.engine_id for e in fitting)
        share = {e.engine_id: (cached_share or {}).get(e.engine_id, 0.0) for e in fitting}
        prompt_chunks = max(1.0, prompt_tokens / chunk_size)

        unprefilled = unprefilled_tokens or {}

        def load(e: EngineView) -> float:
            queued_chunks = unprefilled.get(e.engine_id, 0) / chunk_size
            return (e.running + e.waiting + (open_requests or {}).get(e.engine_id, 0)
                    + QUEUED_CHUNK_REQUESTS * queued_chunks * (1.0 - share[e.engine_id]))

        def free_kv(e: EngineView) -> float:
            # the heartbeat is up to a second old: a burst of documents sent within it would all
            # see the same engine with the most free KV, so what this gateway sent there that has
            # not started answering counts as taken
            if e.capacity_tokens <= 0:
                return e.free_kv_fraction
            return max(0.0, e.free_kv_fraction - unprefilled.get(e.engine_id, 0) / e.capacity_tokens)

        def rotation(e: EngineView) -> int:
            return (ids.index(e.engine_id) - turn) % len(ids)

        def standing(e: EngineView) -> tuple[int, int]:
            return _standing(e, errors), errors.get(e.engine_id, 0)

        if any(share.values()):
            fitting.sort(key=lambda e: (standing(e), load(e) - CACHE_AFFINITY_REQUESTS * share[e.engine_id] * prompt_chunks,
                                        -free_kv(e), rotation(e)))
        else:
            fitting.sort(key=lambda e: (standing(e), -round(free_kv(e) * KV_STEPS), load(e), rotation(e)))
        routes.append(PoolRoute(pool, chunk_size, tuple(fitting)))
    if not routes:
        return RoutePlan(refusal=Refusal.NEVER_FITS, max_context=max_context)
    routes.sort(key=lambda r: _pool_preference(r.chunk_size, prompt_tokens))
    return RoutePlan(routes=tuple(routes), pool=routes[0].pool, max_context=max_context, errors=tuple(errors.items()))


def attempts(plan: RoutePlan) -> list[tuple[PoolRoute, EngineView]]:
    """The order to try engines in: every engine neither reported full nor with recent
    errors, pools in order of preference, then the ones reported full, then those with
    recent errors, each in the same order."""
    errors = dict(plan.errors)
    pairs = [(route, engine) for route in plan.routes for engine in route.engines]
    return sorted(pairs, key=lambda pair: _standing(pair[1], errors))  # stable: keeps the rest of the order


def _standing(engine: EngineView, errors: dict[str, int]) -> int:
    """0: try it first; 1: reported full; 2: it failed lately."""
    if errors.get(engine.engine_id):
        return 2
    return 1 if _reported_full(engine) else 0


def _reported_full(engine: EngineView) -> bool:
    """Whether the engine's own admission check would refuse a request now, by its last heartbeat."""
    return 1.0 - engine.free_kv_fraction > engine.kv_admission_limit or engine.waiting >= engine.max_waiting


def _flag(entry: dict, name: str, default: bool) -> bool:
    value = entry.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):  # "false" would read as true
        raise TypeError(f"{name} must be a boolean, got {value!r}")
    return value


def known_pools(engines: list[EngineView]) -> list[PoolInfo]:
    """The pools these engines make up, whatever their health: each with its chunk_size and
    the largest context among its engines."""
    members: dict[str, list[EngineView]] = {}
    for engine in engines:
        members.setdefault(engine.pool, []).append(engine)
    return [PoolInfo(pool, pool_chunk_size(group), max(e.max_model_len for e in group)) for pool, group in members.items()]


def preferred_pool(pools: Iterable[PoolInfo], prompt_tokens: int, max_tokens: int) -> PoolInfo | None:
    """The pool a request would go to if every known pool had engines: the one whose demand it is."""
    needed = prompt_tokens + max_tokens
    fitting = [p for p in pools if p.max_model_len is None or p.max_model_len >= needed]
    return min(fitting, key=lambda p: (_pool_preference(p.chunk_size, prompt_tokens), p.name), default=None)


def pools_without_engines(pools: Iterable[PoolInfo], engines: list[EngineView], prompt_tokens: int,
                          max_tokens: int) -> list[PoolInfo]:
    """Known pools with no routable engine whose context may hold the request, preferred
    first: those an engine may yet come for (a pool scaling up from zero)."""
    live = {e.pool for e in engines if e.routable}
    needed = prompt_tokens + max_tokens
    waiting = [p for p in pools if p.name not in live and (p.max_model_len is None or p.max_model_len >= needed)]
    return sorted(waiting, key=lambda p: (_pool_preference(p.chunk_size, prompt_tokens), p.name))


def largest_context(pools: Iterable[PoolInfo]) -> int | None:
    """The largest context of any known pool; None while no pool's context is known."""
    return max((p.max_model_len for p in pools if p.max_model_len is not None), default=None)


def pool_chunk_size(members: list[EngineView]) -> int:
    # engines of one pool share a chunk_size; if a rollout briefly mixes two, the most common wins
    sizes = [e.chunk_size for e in members]
    return max(set(sizes), key=lambda s: (sizes.count(s), s))


def _pool_preference(chunk_size: int, prompt_tokens: int) -> tuple:
    if prompt_tokens <= chunk_size:
        return (0, chunk_size)  # one chunk holds it: the smallest such chunk pads least
    return (1, -chunk_size)  # it needs several chunks anyway: the largest chunk needs fewest
