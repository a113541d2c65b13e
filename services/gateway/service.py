"""The gateway's running state and the path of one completion: tokens in, answer out.

`Gateway` owns the registry view, the engine connections and the request accounting, and
runs their background loops. `complete` turns a validated OpenAI request into a Job,
counts it against its pool, opens it on an engine and answers either as one JSON body or
as server-sent events.
"""

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field

import redis
from fastapi.responses import JSONResponse

from common.tokenizer import Tokenizer
from proto import k25_pb2
from services.gateway.accounting import RequestAccounting, write_counts
from services.gateway.api_keys import Caller
from services.gateway.admission import Admission
from services.gateway.canary import AdapterChoice, UnknownModel, choose_adapter, placement_key
from services.gateway.chunker_client import ChunkerClient
from services.gateway.dispatch import Dispatcher, EngineLost, Job, demand_pool
from services.gateway.engine_client import EngineConnections
from services.gateway.engine_errors import RecentErrors
from services.gateway.errors import OpenAIError, internal_error, invalid_request, overloaded
from services.gateway.event_stream import EventStream
from services.gateway.grammar_check import GrammarChecker
from services.gateway.metrics import GatewayMetrics
from services.gateway.openai_schema import SamplingFields
from services.gateway.kv_event_listener import KVEventListener
from services.gateway.outcome import RequestOutcome
from services.gateway.prefix_index import PrefixIndex
from services.gateway.prompt_encoder import PromptEncoder
from services.gateway.registry_view import RegistryView
from services.gateway.request_id import current_request_id
from services.gateway.responses import (
    FINISH_REASONS,
    LogprobsBuilder,
    chat_chunk,
    merge_logprobs,
    sse,
    text_chunk,
    usage_body,
    usage_chunk,
)
from services.gateway.sampling import sampling_params
from services.gateway.settings import GatewaySettings
from services.gateway.shared_limits import exchange
from services.gateway.tool_calls import ToolCallReader, read_answer, tool_finish_reason

log = logging.getLogger(__name__)

# a non-streamed request whose engine shuts down mid-answer is started again elsewhere, at
# most this often (an engine that crashes counts against the request's crash budget, dispatch.py)
MAX_ENGINE_LOSSES = 2


class Gateway:
    def __init__(self, settings: GatewaySettings, tokenizer: Tokenizer, redis_client: redis.Redis):
        self.settings = settings
        self.tokenizer = tokenizer
        self.redis = redis_client
        self.registry = RegistryView(redis_client, settings.release, settings.pools)
        self.engine_errors = RecentErrors(settings.engine_error_window_s)
        self.connections: EngineConnections | None = None
        self.dispatcher: Dispatcher | None = None
        self.started = False  # start() has run: settings, tokenizer and connections are in place
        self.chunker: ChunkerClient | None = None
        self.accounting = RequestAccounting(settings.release)
        self.metrics = GatewayMetrics()
        self.admission = Admission(settings.max_inflight, self.metrics)
        self.gateway_id = uuid.uuid4().hex  # this process's name among the replicas sharing tenant limits
        self._limits_shared = True
        self.encoder = PromptEncoder(tokenizer, settings.tokenizer_threads, self.metrics.tokenize_seconds)
        self.grammars = GrammarChecker(tokenizer)
        self.prefix_index = PrefixIndex(settings.prefix_index_max_blocks)
        self.kv_events = KVEventListener(redis_client, settings.release, self.prefix_index)
        self.inflight = 0
        self._accounting_ok = True
        self._tasks: list[asyncio.Task] = []

    # --- background loops ----------------------------------------------------------------

    async def start(self) -> None:
        s = self.settings
        self.connections = EngineConnections(s.zmq_sndhwm, s.zmq_rcvhwm, s.zmq_linger_ms, s.curve_secret_key)
        self.dispatcher = Dispatcher(self.connections, self.tokenizer.pad_token_id, self.engine_errors, self.metrics,
                                     s.engine_connect_timeout_s, self.prefix_index)
        if s.chunker_address:
            address = s.chunker_address if "://" in s.chunker_address else f"tcp://{s.chunker_address}"
            self.chunker = ChunkerClient(address, timeout_s=s.chunker_timeout_s, curve_secret_key=s.curve_secret_key)
        await self.registry.refresh()
        self.accounting.known_pools = set(self.registry.pools)
        await asyncio.to_thread(lambda: self.grammars.ll_tokenizer)  # built once, before a request waits on it
        self.kv_events.start()
        self._tasks = [asyncio.create_task(self._refresh_loop()), asyncio.create_task(self._flush_loop())]
        self.started = True

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.to_thread(self.kv_events.stop)
        await self._flush()
        await self.connections.close()
        if self.chunker is not None:
            self.chunker.close()
        self.encoder.close()

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.registry_refresh_s)
            await self.registry.refresh()
            self.metrics.redis_up.set(1 if self.registry.redis_ok else 0)
            self.accounting.known_pools = set(self.registry.pools)  # a pool without traffic reads 0 QPS
            self.metrics.engines.clear()
            self.metrics.unroutable_engines.clear()
            for engine in self.registry.engines:
                self.metrics.engines.labels(engine.pool).inc()
                if not engine.routable:
                    self.metrics.unroutable_engines.labels(engine.pool, "unhealthy" if not engine.healthy else "draining").inc()
            if self.registry.redis_ok:
                self.engine_errors.retain({e.engine_id for e in self.registry.engines})
                # before any await: no request is routed by the new registry with the old index
                self.prefix_index.retain({e.engine_id: e.incarnation for e in self.registry.engines})
                await self.connections.retain({e.address for e in self.registry.engines})
            self.metrics.prefix_index_blocks.set(len(self.prefix_index))

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.accounting_flush_s)
            await self._flush()

    async def _flush(self) -> None:
        now = time.time()
        taken = self.accounting.take(now)
        try:
            await asyncio.to_thread(write_counts, self.redis, self.settings.release, taken)
        except redis.RedisError as exc:
            self.accounting.give_back(taken, now)
            if self._accounting_ok:
                log.warning("cannot write request counts to Redis (%s); keeping them until it is back", exc)
            self._accounting_ok = False
            return
        if not self._accounting_ok:
            log.info("request counts are reaching Redis again")
        self._accounting_ok = True
        await self._share_limits()

    async def _share_limits(self) -> None:
        """Exchange tenant states with the other gateways (shared_limits.py); without Redis each
        gateway keeps its own limits."""
        try:
            peers = await asyncio.to_thread(exchange, self.redis, self.settings.release, self.gateway_id,
                                            self.admission.snapshot())
        except redis.RedisError as exc:
            if self._limits_shared:
                log.warning("cannot share tenant limits through Redis (%s); each gateway limits on its own", exc)
            self._limits_shared = False
            return
        self.admission.absorb(peers)
        self._limits_shared = True

    # --- one request -------------------------------------------------------------------------

    def loaded_adapters(self) -> set[str]:
        return {key for engine in self.registry.engines for key in engine.adapters}

    def served_models(self) -> list[str]:
        """The base model, every adapter with a rollout or held by an engine, and every
        "name@version" an engine holds."""
        loaded = self.loaded_adapters()
        names = set(self.registry.rollouts) | {key.partition("@")[0] for key in loaded}
        return [self.settings.model_name, *sorted(names), *sorted(loaded)]

    def resolve_model(self, model: str, caller: Caller, user: str | None) -> AdapterChoice | None:
        """The adapter version this request gets (None: the base model), or 404."""
        try:
            choice = choose_adapter(model, {self.settings.model_name, "base"}, self.registry.rollouts,
                                    self.loaded_adapters(), placement_key(user, caller.key_id, current_request_id()))
        except UnknownModel as exc:
            raise OpenAIError(404, f"{exc}; see GET /v1/models", "invalid_request_error", "model_not_found", "model") from None
        if choice is not None and not caller.may_use(choice.name):
            raise OpenAIError(404, f"the model {model!r} does not exist or your key may not use it",
                              "invalid_request_error", "model_not_found", "model")
        return choice

    def make_job(self, body: SamplingFields, prompt_ids: list[int], caller: Caller, prefix: str,
                 deadline: float | None = None) -> Job:
        """`deadline` (epoch seconds): that of the whole request the job is part of; None: the
        settings' request timeout from now."""
        s = self.settings
        adapter = self.resolve_model(body.model, caller, body.user)
        if not prompt_ids:
            raise invalid_request("the prompt is empty after tokenisation", "prompt")
        if any(not 0 <= t < self.tokenizer.vocab_size for t in prompt_ids):
            raise invalid_request(f"prompt token ids must be in [0, {self.tokenizer.vocab_size})", "prompt")
        sampling = sampling_params(body, len(prompt_ids), self.tokenizer.vocab_size, self.registry.pools.values(), s)
        return Job(
            request_id=f"{prefix}-{uuid.uuid4().hex}", tenant=caller.tenant, model=body.model, prompt_token_ids=prompt_ids,
            sampling=sampling, deadline=time.time() + s.request_timeout_s if deadline is None else deadline, adapter=adapter,
            cache_salt="" if s.share_prefix_cache_across_tenants else caller.tenant,
        )

    async def complete(self, body: SamplingFields, job: Job, chat: bool, parent_span,
                       tool_names: frozenset[str] = frozenset()):
        """Answer an OpenAI request: one JSON body, or a stream of server-sent events. With
        `tool_names`, the answer's calls of those tools become tool_calls."""
        shape = ReplyShape(chat, body.requested_logprobs(), body.include_usage(), tool_names)
        if body.stream:
            return await self.stream(job, shape, parent_span)
        answer = await self.generate(job, shape, parent_span)
        choice = {"index": 0, "finish_reason": FINISH_REASONS[answer.final.finish_reason],
                  "logprobs": merge_logprobs(answer.logprob_parts)}
        if chat and tool_names:
            content, calls = read_answer(answer.text, tool_names)
            choice["message"] = {"role": "assistant", "content": content or None,
                                 "tool_calls": [call.body() for call in calls] or None}
            choice["finish_reason"] = tool_finish_reason(choice["finish_reason"], calls)
        elif chat:
            choice["message"] = {"role": "assistant", "content": answer.text}
        else:
            choice["text"] = answer.text
        return JSONResponse({
            "id": job.request_id, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": job.model, "choices": [choice], "usage": usage_body(answer.final.usage),
        })

    def _begin(self, job: Job, chat: bool, parent_span) -> RequestOutcome:
        return RequestOutcome(self, demand_pool(job, self.registry.pools.values()), time.time(), job, chat, parent_span)

    def _failed(self, outcome: RequestOutcome, exc: BaseException) -> None:
        status = exc.status if isinstance(exc, OpenAIError) else 499  # 499: the client went away
        if status == 503:
            self.metrics.rejected.labels(exc.code or "overloaded").inc()
        outcome.done(status)

    async def generate(self, job: Job, shape: "ReplyShape", parent_span) -> "Answer":
        """Run `job` to its end. An engine lost on the way, or one that shut down before the
        answer was done, is replaced by another, from the start: nothing has reached the
        client yet."""
        outcome = self._begin(job, shape.chat, parent_span)
        try:
            answer = await self._generate(job, shape, outcome)
        except BaseException as exc:
            self._failed(outcome, exc)
            raise
        outcome.done(200)
        return answer

    async def _generate(self, job: Job, shape: "ReplyShape", outcome: RequestOutcome) -> "Answer":
        lost: set[str] = set()
        while True:
            opened = await self._open(job, frozenset(lost))
            outcome.opened(opened)
            logprobs = LogprobsBuilder(self.tokenizer, shape.chat)
            answer = Answer()
            try:
                async for message in opened.messages():
                    if message.WhichOneof("kind") == "delta":
                        outcome.first_token()
                        answer.text += message.delta.text
                        part = logprobs.build(_trim(message.delta.logprobs, shape.logprobs))
                        if part:
                            answer.logprob_parts.append(part)
                    else:
                        answer.final = message.final
                        outcome.finished(message.final)
                return answer
            except EngineLost as exc:
                lost.add(opened.engine.engine_id)
                if exc.crashed:
                    job.lose_engine(opened.engine.engine_id)
                log.warning("request %s: %s; starting it again elsewhere", job.request_id, exc)
                if len(lost) > MAX_ENGINE_LOSSES:
                    raise overloaded("the engines serving this request went away; try again") from None
            finally:
                opened.stream.close()

    async def _open(self, job: Job, exclude: frozenset[str] = frozenset()):
        return await self.dispatcher.open_waiting(job, self.registry, self.settings.engine_wait_s, exclude)

    async def stream(self, job: Job, shape: "ReplyShape", parent_span, epilogue=None) -> EventStream:
        """Start `job` and answer with its server-sent events. The engine is found before the
        response starts, so a refusal is still an HTTP error; `epilogue(text)` may add
        events after the answer, before [DONE]."""
        outcome = self._begin(job, shape.chat, parent_span)
        try:
            opened = await self._open(job)
        except BaseException as exc:
            self._failed(outcome, exc)
            raise
        outcome.opened(opened)
        return self.event_stream(self._events(opened, job, shape, outcome, epilogue))

    def event_stream(self, events) -> EventStream:
        """A streamed answer of `events` that its client must keep reading (event_stream.py)."""
        return EventStream(events, self.settings.stream_stall_s, self.metrics.stalled_streams)

    async def _events(self, opened, job: Job, shape: "ReplyShape", outcome: RequestOutcome, epilogue):
        created = int(time.time())
        logprobs = LogprobsBuilder(self.tokenizer, shape.chat)
        calls = ToolCallReader(shape.tool_names) if shape.tool_names else None
        status = 499  # unless it ends otherwise: the client went away
        text = ""
        try:
            if shape.chat:
                yield sse(chat_chunk(job.request_id, created, job.model, {"role": "assistant", "content": ""}))
            async for message in opened.messages():
                if message.WhichOneof("kind") == "delta":
                    outcome.first_token()
                    part = logprobs.build(_trim(message.delta.logprobs, shape.logprobs))
                    delta = message.delta.text
                    text += delta
                    if calls is not None:
                        for payload in tool_call_chunks(job, created, calls.push(delta), part):
                            yield sse(payload)
                    elif shape.chat:
                        yield sse(chat_chunk(job.request_id, created, job.model, {"content": delta}, logprobs=part))
                    else:
                        yield sse(text_chunk(job.request_id, created, job.model, delta, logprobs=part))
                    continue
                final = message.final
                outcome.finished(final)
                reason = FINISH_REASONS[final.finish_reason]
                if calls is not None:
                    for payload in tool_call_chunks(job, created, calls.finish()):
                        yield sse(payload)
                    reason = tool_finish_reason(reason, calls.calls)
                if shape.chat:
                    yield sse(chat_chunk(job.request_id, created, job.model, {}, reason))
                else:
                    yield sse(text_chunk(job.request_id, created, job.model, "", reason))
                if shape.include_usage:
                    yield sse(usage_chunk(job.request_id, created, job.model, shape.chat, final.usage))
            for payload in epilogue(text) if epilogue else ():
                yield sse(payload)
            yield sse("[DONE]")
            status = 200
        except (OpenAIError, EngineLost) as exc:
            error = exc.error if isinstance(exc, EngineLost) else exc
            log.warning("request %s ended with an error mid-stream: %s", job.request_id, exc)
            status = error.status
            yield sse(error.body())
        except Exception:  # the gateway's own failure: the client gets an error event, the details go to the log
            request_id = current_request_id()
            log.exception("request %s (%s) failed mid-stream", request_id, job.request_id)
            error = internal_error(500, "the gateway failed on this request", "internal_error", request_id)
            status = error.status
            yield sse(error.body())
        finally:
            opened.stream.close()
            outcome.done(status)


@dataclass(frozen=True)
class ReplyShape:
    chat: bool  # chat.completion objects, or text_completion ones
    logprobs: int | None = None  # alternatives per token the client asked for; None: no logprobs
    include_usage: bool = False  # a last stream event with the usage
    tool_names: frozenset[str] = frozenset()  # the answer's calls of these tools become tool_calls


@dataclass
class Answer:
    text: str = ""
    logprob_parts: list = field(default_factory=list)
    final: k25_pb2.Final | None = None


def tool_call_chunks(job: Job, created: int, pieces: list, logprobs=None):
    """The stream chunks of what a ToolCallReader gave out, in order: content, and pieces of
    calls in OpenAI's delta shape (the index counts the answer's calls). The step's logprobs
    go with its first chunk of content, or with a chunk of their own."""
    if logprobs and (not pieces or not isinstance(pieces[0], str)):
        pieces = ["", *pieces]
    for piece in pieces:
        if isinstance(piece, str):
            yield chat_chunk(job.request_id, created, job.model, {"content": piece}, logprobs=logprobs)
            logprobs = None
        else:
            yield chat_chunk(job.request_id, created, job.model, {"tool_calls": [piece.body()]})


def _trim(logprobs, wanted: int | None):
    """The engine is asked for at least one alternative (0 means none on the wire); give back
    only as many as the client asked for."""
    if wanted is None:
        return []
    for token in logprobs:
        del token.top[wanted:]
    return logprobs
