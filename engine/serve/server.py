"""The engine's ZMQ server: a ROUTER socket that feeds an engine's loop and streams back.
It uses the engine-core contract only (engine/core/contract.py), whatever the backend.

Wire (see proto/k25.proto): a client (a gateway's DEALER) sends one frame, a serialized
ClientMessage; the ROUTER sees [identity, payload]. Every frame back is an EngineBatch:
each engine step sends a peer at most one, holding every message of that step for that
peer's requests in order, so the frame count follows steps and peers, not tokens times
requests. For `generate` the client receives TokenDeltas and then exactly one Final or
Error with the same request_id; a refusal is one Error at once (a batch of one). `cancel`
of a running request ends it in the same loop turn (its KV blocks are freed) and answers
with a Final whose finish_reason is ABORT; a cancel for a request that has already
finished, or that another peer sent, is ignored. A frame that is not [identity,
ClientMessage] is answered with an Error INVALID_ARGUMENT (request_id empty when it could
not be read). A peer that disconnects has its requests aborted. On shutdown every request
still running is answered with an Error CANCELLED (one batch per peer), and the engine
closes its socket only once its peers have hung up (or `hang_up_wait_s` has passed): a gateway
would lose the answers it had not read yet (engine/serve/peers.py). A frame longer
than `max_frame_bytes` never reaches the server: ZMQ drops it and disconnects its peer.

Draining (`begin_drain`, then `drain`): new requests are refused with CANCELLED, which a
gateway retries on another engine; requests still queued for their first step are handed
back the same way at once (nothing was computed or sent for them); the ones that started
run on until they finish or the drain ends, and whatever is left then ends with an Error
CANCELLED. A request that streamed tokens is never ended silently and never as a normal
Final: its client learns that the answer is incomplete.

Health (engine/serve/health.py): every step is recorded. While the engine is unhealthy it refuses
new requests with CANCELLED before doing anything, and when it is unhealthy because steps
failed and it has nothing left to run, it runs a one-token probe request of its own
(health_probe.py) every `health_probe_interval_s`, so that one successful step can make it
healthy again.

One thread runs `serve`: it blocks on the socket while the engine is idle, and between
steps only looks for frames without waiting. Frames wait in an Outbox when a peer's
queue is full (the sockets' high-water marks count frames, i.e. steps' worth of output);
once the waiting frames carry `max_pending_messages` messages the engine stops stepping
until they drain, so a slow reader costs memory up to a bound, never a busy loop; a single
peer whose frames carry `max_pending_messages_per_peer` has stopped reading: its requests are
aborted and its frames dropped, so that it does not hold the steps back for the others.

Other threads change the engine (e.g. load or unload an adapter) only through
`call_between_steps` (between_steps.py): the serving thread runs the call before its next step."""

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import zmq

from common.zmq_curve import CurveKeys
from common.zmq_router import DEFAULT_MAX_FRAME_BYTES, bind_router, tcp_endpoint
from engine.base.errors import EngineError, ErrorCode
from engine.core.contract import EngineBackend
from engine.core.request import RequestOutput
from engine.serve.between_steps import CallsBetweenSteps
from engine.serve.health import HealthReport, HealthSettings, StepHealth
from engine.serve.health_probe import HealthProbe
from engine.serve.kv_events import KVEventPublisher
from engine.serve.metrics import EngineMetrics
from engine.serve.outbox import Outbox
from engine.serve.peers import ConnectedPeers
from engine.serve.recent_latency import RecentPercentile
from engine.serve.registry import EngineStats
from engine.serve.tracing import RequestTraces
from engine.serve.wire import (
    decode_client_message,
    engine_frame,
    error_message,
    messages_from_output,
    request_from_proto,
    request_id_of,
)
from proto import k25_pb2

log = logging.getLogger(__name__)

# malformed frames logged one by one before the log only notes every LOG_EVERY_MALFORMED-th
LOG_FIRST_MALFORMED = 10
LOG_EVERY_MALFORMED = 1000


@dataclass(frozen=True)
class ServerSettings:
    port: int = 5555  # 0: any free port (see EngineServer.port)
    bind_host: str = "0.0.0.0"
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES  # longer frames are dropped by ZMQ, their peer disconnected
    curve_secret_key: CurveKeys | bytes | None = None  # the release's CURVE key(s): only their holders may connect
    sndhwm: int = 5000
    rcvhwm: int = 5000
    linger_ms: int = 1000
    # on close, how long the engine waits for its peers to hang up first (peers.py says why)
    hang_up_wait_s: float = 2.0
    idle_poll_ms: int = 100  # how long the loop waits for frames when the engine has nothing to do
    send_retry_ms: int = 10  # how long it waits before retrying peers whose queues were full
    max_frames_per_step: int = 256  # frames read between two engine steps
    # unsent messages (counted inside the waiting EngineBatch frames) beyond which the engine pauses
    max_pending_messages: int = 5000
    # a peer whose own waiting frames carry this many has stopped reading: its requests are aborted
    max_pending_messages_per_peer: int = 1000
    # "name@version" whose requests are failed on purpose (INTERNAL): how tests make a bad canary
    faulty_adapters: frozenset[str] = frozenset()
    health: HealthSettings = HealthSettings()
    health_probe_interval_s: float = 5.0  # how often an engine unhealthy from failed steps tries a step of its own


@dataclass
class _Route:
    """Where a running request's outputs go, and when it last produced a token."""

    identity: bytes
    admitted_at: float
    last_token_at: float | None = None


class EngineServer:
    def __init__(self, engine: EngineBackend, settings: ServerSettings = ServerSettings(), metrics: EngineMetrics | None = None):
        self.engine = engine
        self.settings = settings
        self.metrics = metrics or EngineMetrics()
        self.traces = RequestTraces()  # the command names its engine and pool once it knows them
        if settings.max_frame_bytes < 1:
            raise ValueError(f"max_frame_bytes must be at least 1, got {settings.max_frame_bytes}")
        self.health = StepHealth(settings.health)
        self.draining = False
        self._probe = HealthProbe(settings.health_probe_interval_s)
        self._context = zmq.Context()
        self.socket, self.port, self._authenticator = bind_router(
            self._context, settings.bind_host, settings.port, settings.sndhwm, settings.rcvhwm, settings.linger_ms,
            {zmq.ROUTER_MANDATORY: 1, zmq.MAXMSGSIZE: settings.max_frame_bytes}, settings.curve_secret_key,
        )
        self._outbox = Outbox(self.socket)
        self._peers = ConnectedPeers(self.socket)
        self._routes: dict[str, _Route] = {}
        self.malformed_frames = 0
        self._calls = CallsBetweenSteps()
        self.recent_ttft = RecentPercentile(0.95, window_s=60.0)  # the heartbeat's, for the autoscaler's latency guard
        self.stats = EngineStats()
        self._publish_stats()
        self.kv_events: KVEventPublisher | None = None

    def publish_cache_events(self, publisher: KVEventPublisher) -> None:
        """From now on, hand every step's prefix-cache changes to `publisher`."""
        self.engine.set_kv_events(True)
        self.kv_events = publisher

    # --- the loop -----------------------------------------------------------------------

    def serve(self, stop: threading.Event) -> None:
        """Serve until `stop.is_set()` (an Event, or anything with that method)."""
        log.info("engine server listening on %s", tcp_endpoint(self.settings.bind_host, self.port))
        while not stop.is_set():
            self.run_once()

    def health_report(self) -> HealthReport:
        """Safe to call from any thread."""
        return self.health.report(self.draining)

    def call_between_steps(self, fn: Callable[[], object]) -> Future:
        """Run `fn` on the serving thread before its next step (within idle_poll_ms when idle);
        the future holds its result or exception."""
        return self._calls.put(fn)

    def run_once(self) -> None:
        self._peers.update()
        self._calls.run()
        self._probe_if_due()
        if self._can_step():
            timeout_ms = 0
        elif self._outbox.pending:
            timeout_ms = self.settings.send_retry_ms
        else:
            timeout_ms = self.settings.idle_poll_ms
        if self.socket.poll(timeout_ms, zmq.POLLIN):
            self._receive()
        if self._can_step():
            self.health.busy()
            result = self.engine.step()
            self.health.step_finished(result.forward_failed)
            self.traces.stepped(result.record)
            self._dispatch(result.outputs)
            if self.kv_events is not None:
                self.kv_events.add(result.kv_events)
        if not self._can_step():
            self.health.idle()
        # published before sending, so that a client that has a step's output also sees its load
        self._publish_stats()
        if self._flush():
            self._publish_stats()

    def _can_step(self) -> bool:
        return self.engine.has_unfinished() and self._outbox.pending < self.settings.max_pending_messages

    def _probe_if_due(self) -> None:
        """Gateways send an engine that is unhealthy from failed steps nothing, and it would refuse
        it: a one-token request of its own, whose output goes nowhere, shows whether steps work again."""
        if self.draining or self.engine.has_unfinished() or not self.health.failing:
            return
        probe = self._probe.next_request(self.engine, time.monotonic())
        if probe is None:
            return
        log.info("engine unhealthy (%s); probing with a one-token request", self.health_report().reason)
        try:
            self.engine.add_request(probe)
        except EngineError as error:
            log.warning("health probe not queued: %s", error.message)

    def _publish_stats(self) -> None:
        # one immutable snapshot: the heartbeat thread reads it without touching the engine
        self.stats = EngineStats(**vars(self.engine.load()), ttft_p95_s=self.recent_ttft.value(time.monotonic()))
        self.metrics.update_load(self.stats)

    # --- frames in ----------------------------------------------------------------------

    def _receive(self) -> None:
        for _ in range(self.settings.max_frames_per_step):
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._handle(frames)

    def _handle(self, frames: list[bytes]) -> None:
        identity, request_id = frames[0], ""
        try:
            if len(frames) != 2:
                raise EngineError(ErrorCode.INVALID_ARGUMENT, f"expected one ClientMessage frame, got {len(frames) - 1} frames")
            message = decode_client_message(frames[1])
            request_id = request_id_of(message)
            if message.WhichOneof("kind") == "generate":
                self._admit(identity, message.generate)
            else:
                self._cancel(identity, message.cancel.request_id)
        except EngineError as error:
            if error.code is ErrorCode.INVALID_ARGUMENT:
                self._log_malformed(identity, error)
            else:
                log.debug("refused %r: %s", request_id, error)
            self._refuse(identity, request_id, error)
        except Exception as exc:  # a bug handling one frame must not stop the server
            log.exception("failed to handle a frame from peer %s", identity.hex())
            self._refuse(identity, request_id, EngineError(ErrorCode.INTERNAL, f"engine server error: {exc}"))

    def _admit(self, identity: bytes, request: k25_pb2.GenerateRequest) -> None:
        if self.draining:
            raise EngineError(ErrorCode.CANCELLED, "the engine is draining (shutting down) and takes no new requests; "
                              "nothing was done, so another engine may serve it")
        health = self.health_report()
        if not health.healthy:
            raise EngineError(ErrorCode.CANCELLED, f"the engine is unhealthy ({health.reason}) and takes no new requests; "
                              "nothing was done, so another engine may serve it")
        if f"{request.adapter.name}@{request.adapter.version}" in self.settings.faulty_adapters:
            raise EngineError(ErrorCode.INTERNAL, "fault injected for this adapter version (--inject-fault)")
        self.engine.add_request(request_from_proto(request))
        self._routes[request.request_id] = _Route(identity, time.monotonic())
        self.traces.admitted(request)

    def _cancel(self, identity: bytes, request_id: str) -> None:
        route = self._routes.get(request_id)
        if route is None or route.identity != identity:
            log.debug("cancel of %r ignored: no such request from this peer", request_id)
            return
        output = self.engine.abort(request_id)
        if output is None:
            del self._routes[request_id]
            return
        self._dispatch([output])

    def _log_malformed(self, identity: bytes, error: EngineError) -> None:
        self.malformed_frames += 1
        n = self.malformed_frames
        if n <= LOG_FIRST_MALFORMED or n % LOG_EVERY_MALFORMED == 0:
            log.warning("invalid frame from peer %s (%d so far): %s", identity.hex(), n, error.message)

    # --- messages out -------------------------------------------------------------------

    def _send(self, identity: bytes, messages: list[k25_pb2.EngineMessage]) -> None:
        self._outbox.put(identity, engine_frame(messages), len(messages))

    def _refuse(self, identity: bytes, request_id: str, error: EngineError) -> None:
        self.metrics.request_errors.labels(code=error.code.value).inc()
        self._send(identity, [error_message(request_id, error)])

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        """One frame per peer for these outputs (one step's), every message in output order."""
        now = time.monotonic()
        by_peer: dict[bytes, list[k25_pb2.EngineMessage]] = {}
        for output in outputs:
            route = self._routes.get(output.request_id)
            if route is None:
                continue
            if output.token_ids:
                if route.last_token_at is None:
                    self.metrics.time_to_first_token.observe(now - route.admitted_at)
                    self.recent_ttft.add(now, now - route.admitted_at)
                else:
                    self.metrics.inter_token_latency.observe(now - route.last_token_at)
                route.last_token_at = now
            if output.finished:
                del self._routes[output.request_id]
                self._count_finished(output, now - route.admitted_at)
                self.traces.finished(output)
            by_peer.setdefault(route.identity, []).extend(messages_from_output(output))
        for identity, messages in by_peer.items():
            if messages:
                self._send(identity, messages)

    def _count_finished(self, output: RequestOutput, duration_s: float) -> None:
        self.metrics.requests_finished.labels(finish_reason=output.finish_reason.value).inc()
        self.metrics.request_duration.observe(duration_s)
        if output.error is not None:
            self.metrics.request_errors.labels(code=output.error.code.value).inc()

    def _peer_gone(self, identity: bytes, why: str) -> None:
        orphans = [rid for rid, route in self._routes.items() if route.identity == identity]
        for request_id in orphans:
            route = self._routes.pop(request_id)
            output = self.engine.abort(request_id)
            if output is not None:
                self._count_finished(output, time.monotonic() - route.admitted_at)
                self.traces.finished(output)
        if orphans:
            log.warning("peer %s %s; aborted its %d requests", identity.hex(), why, len(orphans))

    # --- shutdown -----------------------------------------------------------------------

    def begin_drain(self) -> None:
        """Take no more work: new requests are refused with CANCELLED from now on, those still
        queued for their first step are handed back with CANCELLED at once, and no more
        prefix-cache changes are announced (the publisher's stop tells gateways to forget this
        engine's blocks). Call it from the serving thread."""
        self.draining = True
        self.kv_events = None
        unstarted = self.engine.drain()
        self._end(unstarted, EngineError(
            ErrorCode.CANCELLED, "the engine began draining (shutting down) before this request started; "
            "nothing was computed or sent, so another engine may serve it"))
        log.info("draining: %d running requests may finish; %d not started handed back", len(self._routes), len(unstarted))
        self._publish_stats()
        self._flush()

    def drain(self, timeout_s: float, hurry: Callable[[], bool] = lambda: False) -> None:
        """Serve until the running requests have finished and their answers have left, for up
        to `timeout_s` or until `hurry()` says to stop waiting; then close, ending what is left
        with CANCELLED."""
        if not self.draining:
            self.begin_drain()
        deadline = time.monotonic() + timeout_s
        why = ""
        while self._routes or self._outbox.pending:
            if time.monotonic() >= deadline:
                why = f"its drain timeout of {timeout_s:g} s passed"
            elif hurry():
                why = "a second stop signal ended its drain"
            if why:
                log.warning("drain ended (%s) with %d requests still running: they end CANCELLED", why, len(self._routes))
                break
            self.run_once()
        self.close(f"the engine shut down before this request finished ({why}); the answer is incomplete" if why
                   else "the engine is shutting down")

    def close(self, why: str = "the engine is shutting down") -> None:
        """End every request still running with an Error CANCELLED saying `why`, wait for the
        peers to hang up, send what they take within the linger time, close the socket, then
        the engine (its KV tiers' copies under way finish, their worker thread ends)."""
        self._end(list(self._routes), EngineError(ErrorCode.CANCELLED, why))
        self._routes.clear()
        self._calls.cancel()
        self.traces.close()
        self._let_peers_hang_up()
        deadline = time.monotonic() + self.settings.linger_ms / 1000
        # frames a peer's full queue held back are still here, not in ZMQ: its linger would not send them
        self._flush()
        while self._outbox.pending and time.monotonic() < deadline:
            time.sleep(self.settings.send_retry_ms / 1000)
            self._flush()
        self._peers.close()
        self.socket.close(linger=max(0, round((deadline - time.monotonic()) * 1000)))
        if self._authenticator:
            self._authenticator.stop()
        self._context.term()
        self._publish_stats()
        self.engine.close()

    def _let_peers_hang_up(self) -> None:
        """Until every peer has closed its connection, for up to `hang_up_wait_s`: send what is
        left and refuse what arrives (CANCELLED: another engine takes it)."""
        self.draining = True
        deadline = time.monotonic() + self.settings.hang_up_wait_s
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        poller.register(self._peers.events, zmq.POLLIN)
        while True:
            self._flush()
            self._peers.update()
            left_ms = (deadline - time.monotonic()) * 1000
            if self._peers.count <= 0:
                return
            if left_ms <= 0:
                log.info("closing with %d peer connections still open after %g s: what they had not read yet may be lost",
                         self._peers.count, self.settings.hang_up_wait_s)
                return
            timeout_ms = min(left_ms, self.settings.send_retry_ms if self._outbox.pending else self.settings.idle_poll_ms)
            if self.socket in dict(poller.poll(timeout_ms)):
                self._receive()

    def _end(self, request_ids: list[str], error: EngineError) -> None:
        """End these requests now with `error`, answering their peers (one frame per peer)."""
        self._dispatch([output for output in (self.engine.abort(rid, error) for rid in request_ids) if output is not None])

    def _flush(self) -> bool:
        """Send what the peers take now; True if a peer turned out to be gone (its requests aborted)."""
        gone = self._outbox.flush()
        stalled = self._outbox.drop_stalled(self.settings.max_pending_messages_per_peer)
        for identity in gone + stalled:
            self._peer_gone(identity, "stopped reading" if identity in stalled else "disconnected")
        return bool(gone or stalled)
