"""Sending one generation to an engine: plan the route, pad for the pool, try engines in
order until one takes it, and read its responses.

An engine that refuses before starting (full KV or queue, shutting down, a chunk_size it
does not share) or whose connection is gone is skipped for the next candidate; only when
every candidate refused does the client get 503 with Retry-After. The first response is
awaited before anything is returned, so a refusal never reaches the client as a half-sent
200.
"""

import itertools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from common.padding import pad_to_chunk_size
from common.prefix_hash import cache_seed, chain_block_hashes
from proto import k25_pb2
from services.gateway.canary import AdapterChoice
from services.gateway.engine_client import ENGINE_GONE, EngineConnections, EngineStream, EngineUnavailable
from services.gateway.errors import (
    RETRY_AFTER_S,
    RETRYABLE_ENGINE_ERRORS,
    OpenAIError,
    from_engine_error,
    invalid_request,
    overloaded,
)
from services.gateway.prefix_index import PrefixIndex
from services.gateway.routing import EngineView, Refusal, RoutePlan, attempts, plan_route

_turns = itertools.count()  # one per request: rotates the order of equally loaded engines


class EngineLost(Exception):
    """The engine went away after the answer had started."""


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


@dataclass
class OpenedStream:
    pool: str
    engine: EngineView
    stream: EngineStream
    first: k25_pb2.EngineMessage
    deadline: float  # epoch seconds
    expected_cached_tokens: int = 0  # prompt tokens the prefix index expected this engine to hold

    async def messages(self) -> AsyncIterator[k25_pb2.EngineMessage]:
        """Every response up to and including the Final; an Error raises OpenAIError, a lost
        engine EngineLost, a passed deadline a 504."""
        message = self.first
        while True:
            if message is ENGINE_GONE:
                raise EngineLost(f"engine {self.engine.engine_id} went away mid-answer")
            kind = message.WhichOneof("kind")
            if kind == "error":
                raise from_engine_error(message.error)
            yield message
            if kind == "final":
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


async def open_stream(
    job: Job, engines: list[EngineView], connections: EngineConnections, pad_token_id: int,
    exclude: frozenset[str] = frozenset(), connect_timeout_s: float = 1.0, prefix_index: PrefixIndex | None = None,
) -> OpenedStream:
    """Start `job` on the first engine that takes it (engine ids in `exclude` are skipped).
    A request for an adapter goes only to engines that report that version loaded. With a
    prefix index, engines holding the prompt's prefix are preferred (routing.py), and the
    engine that takes the job is recorded as holding it."""
    engines = [e for e in engines if e.engine_id not in exclude and (job.adapter is None or job.adapter.key in e.adapters)]
    if job.adapter is not None and not engines:
        raise OpenAIError(503, f"no engine holds adapter {job.adapter.key} yet; try again shortly", "server_error",
                          "adapter_loading", headers={"Retry-After": str(RETRY_AFTER_S)})
    open_requests = {e.engine_id: connections.open_requests(e.address) for e in engines}
    cached_share = cached_shares(job, engines, prefix_index) if prefix_index is not None else None
    plan = plan_route(engines, len(job.prompt_token_ids), job.sampling.max_tokens,
                      open_requests=open_requests, turn=next(_turns), cached_share=cached_share)
    if plan.refusal is not None:
        raise refusal_error(plan, len(job.prompt_token_ids), job.sampling.max_tokens)
    requests: dict[int, k25_pb2.GenerateRequest] = {}  # chunk_size -> the padded request
    for route, engine in attempts(plan):
        if route.chunk_size not in requests:
            requests[route.chunk_size] = job.padded_for(route.chunk_size, pad_token_id)
        try:
            stream = await connections.get(engine.address).submit(requests[route.chunk_size], connect_timeout_s)
        except EngineUnavailable:
            continue
        try:
            first = await _next(stream, job.remaining_s())
        except BaseException:
            stream.close()
            raise
        if first is ENGINE_GONE:
            stream.close()
            continue
        if first.WhichOneof("kind") == "error":
            stream.close()
            if first.error.code in RETRYABLE_ENGINE_ERRORS:
                continue
            raise from_engine_error(first.error)
        if prefix_index is not None and engine.block_size:
            prefix_index.record(engine.engine_id, engine.incarnation, job.block_hashes(engine.block_size))
        expected = round((cached_share or {}).get(engine.engine_id, 0.0) * len(job.prompt_token_ids))
        return OpenedStream(route.pool, engine, stream, first, job.deadline, expected)
    raise overloaded("every engine that could serve this request refused it or is unreachable; try again shortly")


def cached_shares(job: Job, engines: list[EngineView], index: PrefixIndex) -> dict[str, float]:
    """Per engine id, the share of the job's prompt that the index says its prefix cache holds."""
    shares = {}
    for block_size in {e.block_size for e in engines if e.block_size}:
        matched = index.matched_blocks(job.block_hashes(block_size))
        for engine in engines:
            if engine.block_size == block_size and engine.engine_id in matched:
                shares[engine.engine_id] = matched[engine.engine_id] * block_size / len(job.prompt_token_ids)
    return shares


async def _next(stream: EngineStream, timeout_s: float):
    try:
        return await stream.next(timeout_s)
    except TimeoutError:
        raise OpenAIError(504, "the request's deadline passed before the engine answered", "server_error", "timeout") from None


def plan_pool(job: Job, engines: list[EngineView]) -> str | None:
    """The pool this request's demand counts against (also when every engine is full, or
    none holds its adapter yet)."""
    return plan_route(engines, len(job.prompt_token_ids), job.sampling.max_tokens).pool

