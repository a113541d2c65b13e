"""Sending one generation to an engine: plan the route, pad for the pool, try engines in
order until one takes it, and read its responses.

An engine that refuses before starting (full KV or queue, shutting down or unhealthy, a
chunk_size it does not share) or that cannot be reached is skipped for the next candidate;
one that fails the request (INTERNAL) before its first token is too, once per request:
another engine may serve it, but a request that breaks every engine should not break them
all. An engine whose connection drops while it holds the request is lost, and a request has
a crash budget (`crash_budget_spent`): the first engine it loses, before or after its first
token, is replaced by another; the second refuses it, logged with its id, so that one query
of death cannot crash the fleet engine by engine. Nothing is retried after the first token, which may have reached the
client. Only when every candidate refused does the client get 503 with Retry-After. The
first response is awaited before anything is returned, so a refusal never reaches the
client as a half-sent 200. Every failure is remembered against its engine (engine_errors.py)
so that routing tries others first.

When no engine can take the request but one may yet register (nothing routable at all, or
only a pool without engines would hold it), the request waits for the registry to bring
one, up to a bound; then it gets 503 with Retry-After.
"""

import itertools
import logging
import math
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field

from common.padding import pad_to_chunk_size
from common.prefix_hash import cache_seed, chain_block_hashes
from proto import k25_pb2
from services.gateway.canary import AdapterChoice
from services.gateway.engine_client import ENGINE_GONE, EngineConnections, EngineStream, EngineUnavailable
from services.gateway.engine_errors import RecentErrors
from services.gateway.errors import (
    RETRY_AFTER_S,
    RETRYABLE_ENGINE_ERRORS,
    OpenAIError,
    from_engine_error,
    invalid_request,
    overloaded,
)
from services.gateway.held_prefix import held_share, saved_share
from services.gateway.metrics import GatewayMetrics
from services.gateway.prefix_index import PrefixIndex
from services.gateway.registry_view import RegistryView
from services.gateway.responses import FINISH_REASONS
from services.gateway.routing import (
    EngineView,
    PoolInfo,
    Refusal,
    RoutePlan,
    attempts,
    plan_route,
    pools_without_engines,
    preferred_pool,
)

log = logging.getLogger(__name__)

_turns = itertools.count()  # one per request: rotates the order of equally loaded engines

# engine errors that count against the engine (the others are about the request, or its load)
ENGINE_FAULTS = {k25_pb2.INTERNAL, k25_pb2.CANCELLED, k25_pb2.CHUNK_SIZE_MISMATCH}
# engines that may fail one request before its first token, beyond those that refuse it
MAX_FAULT_RETRIES = 1
# engines a request may lose (their connection dropped while they held it) before it is refused
MAX_ENGINES_LOST = 2


def crash_budget_spent(engines_lost: int, limit: int = MAX_ENGINES_LOST) -> bool:
    """Whether a request that has lost this many engines must be refused rather than tried again."""
    return engines_lost >= limit


def crash_budget_error(request_id: str, engines_lost: int) -> OpenAIError:
    """What a client whose request lost too many engines is told; OpenAI's clients do not retry it."""
    return OpenAIError(
        502, f"the engines serving this request went away {engines_lost} times; it is not tried again, since a request "
             f"that crashes engines would take them all down in turn (request {request_id})",
        "server_error", "request_crashed_engines", headers={"x-should-retry": "false"})


class EngineLost(Exception):
    """The engine went away, or ended the answer because it was shutting down, after the answer
    had started: another engine may run it again from the start if none of it reached the
    client. `error` is what a client that already has part of the answer is told."""

    def __init__(self, message: str, error: OpenAIError | None = None, crashed: bool = True):
        super().__init__(message)
        self.crashed = crashed  # the connection dropped (False: the engine shut down and cancelled it)
        self.error = error or OpenAIError(502, "the engine serving this request went away; the answer is incomplete",
                                          "server_error", "engine_lost")


@dataclass
class Job:
    """One generation as the gateway will send it, before padding."""

    request_id: str
    tenant: str
    model: str
    prompt_token_ids: list[int]
    sampling: k25_pb2.SamplingParams
    deadline: float  # epoch seconds
    adapter: AdapterChoice | None = None  # None: the base model
    traceparent: str = ""
    tracestate: str = ""
    cache_salt: str = ""  # shares cached prefix blocks only with requests of the same salt
    engines_lost: list[str] = field(default_factory=list)  # ids of engines whose connection dropped while they held it
    _hashes: dict[int, list[int]] = field(default_factory=dict, repr=False)  # block size -> prompt block hashes

    def block_hashes(self, block_size: int) -> list[int]:
        """The prefix hashes of the prompt's full blocks, as an engine with this block size computes them."""
        if block_size not in self._hashes:
            seed = cache_seed(self.adapter.key if self.adapter else "", self.cache_salt)
            self._hashes[block_size] = chain_block_hashes(self.prompt_token_ids, block_size, seed)
        return self._hashes[block_size]

    def padded_for(self, chunk_size: int, pad_token_id: int) -> k25_pb2.GenerateRequest:
        padded, pad_length = pad_to_chunk_size(self.prompt_token_ids, chunk_size, pad_token_id)
        return k25_pb2.GenerateRequest(
            request_id=self.request_id, tenant=self.tenant, model=self.model,
            adapter=k25_pb2.Adapter(name=self.adapter.name, version=self.adapter.version) if self.adapter else None,
            prompt_token_ids=padded, pad_length=pad_length, chunk_size=chunk_size,
            sampling=self.sampling, deadline_unix_s=self.deadline,
            trace=k25_pb2.TraceContext(traceparent=self.traceparent, tracestate=self.tracestate), cache_salt=self.cache_salt,
        )

    def remaining_s(self) -> float:
        return max(0.0, self.deadline - time.time())

    def lose_engine(self, engine_id: str) -> None:
        """Count an engine lost while it held this job; raises the refusal once the crash budget is spent."""
        self.engines_lost.append(engine_id)
        if crash_budget_spent(len(self.engines_lost)):
            log.error("request %s lost engines %s while they held it: refused, as it may be what crashes them",
                      self.request_id, ", ".join(self.engines_lost))
            raise crash_budget_error(self.request_id, len(self.engines_lost))


@dataclass
class OpenedStream:
    pool: str
    engine: EngineView
    stream: EngineStream
    first: k25_pb2.EngineMessage
    deadline: float  # epoch seconds
    errors: RecentErrors
    expected_cached_tokens: int = 0  # prompt tokens the prefix index expected this engine to hold

    async def messages(self) -> AsyncIterator[k25_pb2.EngineMessage]:
        """Every response up to and including the Final. A lost engine raises EngineLost, and so
        does an Error CANCELLED (the engine shut down before the answer was done); another
        Error raises OpenAIError, and so does a Final ABORT (the engine stopped the request
        unfinished: not an answer) or with a finish reason this gateway does not know; a passed
        deadline raises a 504."""
        message = self.first
        while True:
            if message is ENGINE_GONE:
                self.errors.failed(self.engine.engine_id, time.time())
                raise EngineLost(f"engine {self.engine.engine_id} went away mid-answer")
            kind = message.WhichOneof("kind")
            if kind == "error":
                if message.error.code in ENGINE_FAULTS:
                    self.errors.failed(self.engine.engine_id, time.time())
                error = from_engine_error(message.error)
                if message.error.code == k25_pb2.CANCELLED:
                    raise EngineLost(f"engine {self.engine.engine_id} shut down mid-answer: {error.message}", error,
                                     crashed=False)
                raise error
            if kind == "final" and message.final.finish_reason == k25_pb2.ABORT:
                raise OpenAIError(502, "the engine stopped this request before it finished; the answer is incomplete",
                                  "server_error", "engine_aborted")
            if kind == "final" and message.final.finish_reason not in FINISH_REASONS:  # an engine newer than this gateway
                raise OpenAIError(502, f"the engine ended this request with finish reason {message.final.finish_reason}, "
                                       "which this gateway does not know", "server_error", "engine_error")
            yield message
            if kind == "final":
                self.errors.served(self.engine.engine_id)
                return
            message = await _next(self.stream, max(0.0, self.deadline - time.time()))


def refusal_error(plan: RoutePlan, prompt_tokens: int, max_tokens: int) -> OpenAIError:
    if plan.refusal is Refusal.NEVER_FITS:
        return invalid_request(
            f"this request needs {prompt_tokens + max_tokens} tokens (prompt {prompt_tokens} + max_tokens {max_tokens}) "
            f"but the largest context of any engine pool is {plan.max_context} tokens",
            param="max_tokens", code="context_length_exceeded",
        )
    return overloaded("no engine is available; try again shortly")


class NoEngineYet(OpenAIError):
    """No engine can take the request now, but one may register: nothing routable is in the
    registry, or only a pool without engines (`pool`, when known) would hold the request."""

    def __init__(self, pool: str | None, waited_s: float = 0.0):
        where = f"of pool {pool!r} " if pool else ""
        waited = f" within {waited_s:g} s" if waited_s else ""
        retry_after = max(RETRY_AFTER_S, math.ceil(waited_s))
        super().__init__(503, f"no engine {where}is available{waited} (the pool may be starting from zero "
                              f"replicas); try again in {retry_after} s", "server_error", "no_engine_available",
                         headers={"Retry-After": str(retry_after)})
        self.pool = pool


@dataclass
class Dispatcher:
    """Opens jobs on engines: what that needs besides the job and the registry."""

    connections: EngineConnections
    pad_token_id: int
    errors: RecentErrors
    metrics: GatewayMetrics
    connect_timeout_s: float = 1.0
    prefix_index: PrefixIndex | None = None
    # per engine id, prompt tokens this gateway sent there that it did not expect cached and
    # that have not produced a first token yet: prefill queued or running (routing.py weighs it)
    unprefilled: dict[str, int] = field(default_factory=dict)

    async def open_waiting(self, job: Job, registry: RegistryView, wait_s: float,
                           exclude: frozenset[str] = frozenset()) -> OpenedStream:
        """`open`, but while no engine can take the job yet, wait for the registry to bring
        one, up to `wait_s` seconds (and the job's deadline)."""
        give_up_at = time.monotonic() + min(wait_s, job.remaining_s())
        waiting = False
        try:
            while True:
                try:
                    opened = await self.open(job, registry.engines, registry.pools.values(), exclude)
                except NoEngineYet as missing:
                    if time.monotonic() >= give_up_at:
                        if waiting:
                            self.metrics.engine_waits.labels("timed_out").inc()
                        raise NoEngineYet(missing.pool, wait_s) from None
                    if not waiting:
                        waiting = True
                        self.metrics.waiting_for_engine.inc()
                    await registry.wait_for_refresh(give_up_at - time.monotonic())
                    continue
                if waiting:
                    self.metrics.engine_waits.labels("served").inc()
                return opened
        finally:
            if waiting:
                self.metrics.waiting_for_engine.dec()

    async def open(self, job: Job, engines: list[EngineView], pools: Iterable[PoolInfo] = (),
                   exclude: frozenset[str] = frozenset()) -> OpenedStream:
        """Start `job` on the first engine that takes it (engine ids in `exclude` are skipped).
        A request for an adapter goes only to engines that report that version loaded. With a
        prefix index, engines holding the prompt's prefix are preferred (routing.py), and each
        engine the job is sent to is recorded as holding it before it is sent (one that refuses
        it or cannot be reached keeps a wrong entry, which costs a cache miss at worst, until
        it ages out or the engine leaves). Raises NoEngineYet when none can
        take it but one may register (`pools`: those the gateway knows of)."""
        prompt_tokens, max_tokens = len(job.prompt_token_ids), job.sampling.max_tokens
        if not any(e.routable for e in engines):
            wanted = preferred_pool(pools, prompt_tokens, max_tokens)
            raise NoEngineYet(wanted.name if wanted else None)
        exclude = exclude | set(job.engines_lost)
        candidates = [e for e in engines if e.routable and e.engine_id not in exclude
                      and (job.adapter is None or job.adapter.key in e.adapters)]
        if job.adapter is not None and not candidates:
            raise OpenAIError(503, f"no engine holds adapter {job.adapter.key} yet; try again shortly", "server_error",
                              "adapter_loading", headers={"Retry-After": str(RETRY_AFTER_S)})
        open_requests = {e.engine_id: self.connections.open_requests(e.address) for e in candidates}
        held = held_shares(job, candidates, self.prefix_index) if self.prefix_index is not None else {}
        saved = {engine_id: share for engine_id, (_, share) in held.items()}
        plan = plan_route(candidates, prompt_tokens, max_tokens, open_requests=open_requests, turn=next(_turns),
                          cached_share=saved, recent_errors=self.errors.counts(time.time()),
                          unprefilled_tokens=self.unprefilled)
        if plan.refusal is Refusal.NEVER_FITS:
            missing = pools_without_engines(pools, engines, prompt_tokens, max_tokens)
            if missing:
                raise NoEngineYet(missing[0].name)
        if plan.refusal is not None:
            raise refusal_error(plan, prompt_tokens, max_tokens)
        requests: dict[int, k25_pb2.GenerateRequest] = {}  # chunk_size -> the padded request
        faults_left = MAX_FAULT_RETRIES
        last_fault: k25_pb2.Error | None = None  # the INTERNAL error of the last engine tried, if it failed so
        previous_failure = None  # why the engine tried before this one did not take the job
        for route, engine in attempts(plan):
            if previous_failure is not None:
                self.metrics.engine_retries.labels(previous_failure).inc()
            last_fault = None
            if route.chunk_size not in requests:
                requests[route.chunk_size] = job.padded_for(route.chunk_size, self.pad_token_id)
            if self.prefix_index is not None and engine.block_size:
                # before the first await, not at the first token: a document's next question,
                # planned while this one is sent, waits or prefills there, follows it and finds its KV
                self.prefix_index.record(engine.engine_id, engine.incarnation, job.block_hashes(engine.block_size))
            uncached = prompt_tokens - round(saved.get(engine.engine_id, 0.0) * prompt_tokens)
            self.unprefilled[engine.engine_id] = self.unprefilled.get(engine.engine_id, 0) + uncached
            try:
                stream = await self.connections.get(engine.address).submit(requests[route.chunk_size], self.connect_timeout_s)
            except EngineUnavailable:
                self._prefilled(engine.engine_id, uncached)
                self.errors.failed(engine.engine_id, time.time())
                previous_failure = "unreachable"
                continue
            try:
                first = await _next(stream, job.remaining_s())
            except BaseException:
                stream.close()
                raise
            finally:
                self._prefilled(engine.engine_id, uncached)
            if first is ENGINE_GONE:
                stream.close()
                self.errors.failed(engine.engine_id, time.time())
                job.lose_engine(engine.engine_id)
                previous_failure = "lost"
                continue
            if first.WhichOneof("kind") == "error":
                stream.close()
                code = first.error.code
                reason = k25_pb2.ErrorCode.Name(code).lower()
                if code in ENGINE_FAULTS:
                    self.errors.failed(engine.engine_id, time.time())
                if code in RETRYABLE_ENGINE_ERRORS:
                    previous_failure = reason
                    continue
                if code == k25_pb2.INTERNAL and faults_left:
                    faults_left -= 1
                    previous_failure, last_fault = reason, first.error
                    continue
                raise from_engine_error(first.error)
            expected = round(held.get(engine.engine_id, (0.0, 0.0))[0] * prompt_tokens)
            return OpenedStream(route.pool, engine, stream, first, job.deadline, self.errors, expected)
        if last_fault is not None:  # the last engine failed the job rather than refusing it
            raise from_engine_error(last_fault)
        raise overloaded("every engine that could serve this request refused it or is unreachable; try again shortly")

    def _prefilled(self, engine_id: str, tokens: int) -> None:
        """The engine answered (or failed) a job's first frame: its prefill no longer waits there."""
        left = self.unprefilled.get(engine_id, 0) - tokens
        if left > 0:
            self.unprefilled[engine_id] = left
        else:
            self.unprefilled.pop(engine_id, None)


def held_shares(job: Job, engines: list[EngineView], index: PrefixIndex) -> dict[str, tuple[float, float]]:
    """Per engine id that the index says holds the start of the job's prompt in some tier: the
    share of the prompt it holds, and the share of its prefill that saves (held_prefix.py)."""
    shares = {}
    prompt_tokens = len(job.prompt_token_ids)
    for block_size in {e.block_size for e in engines if e.block_size}:
        matched = index.matched_blocks(job.block_hashes(block_size))
        for engine in engines:
            run = matched.get(engine.engine_id) if engine.block_size == block_size else None
            if run is not None:
                shares[engine.engine_id] = (held_share(run, block_size, prompt_tokens),
                                            saved_share(run, block_size, prompt_tokens))
    return shares


async def _next(stream: EngineStream, timeout_s: float):
    try:
        return await stream.next(timeout_s)
    except TimeoutError:
        raise OpenAIError(504, "the request's deadline passed before the engine answered", "server_error", "timeout") from None


def demand_pool(job: Job, pools: Iterable[PoolInfo]) -> str | None:
    """The pool this request's demand counts against: the one it prefers among every pool the
    gateway knows of, also when that pool is full, has no engine yet, or none holds the
    adapter yet. None when no known pool's context holds it."""
    wanted = preferred_pool(pools, len(job.prompt_token_ids), job.sampling.max_tokens)
    return wanted.name if wanted else None
