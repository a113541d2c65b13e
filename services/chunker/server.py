"""The chunker's ZMQ server: a ROUTER socket, one ChunkRequest frame in, one ChunkResponse out.

A frame that is not [identity, ChunkRequest] is answered with an Error INVALID_ARGUMENT
(request_id empty when it could not be read), and so is a document above
`max_document_bytes`. Frames beyond `max_frame_bytes` (four times the document limit)
are dropped by ZMQ itself, which closes that peer's connection: the bound on what one
frame may cost in memory. Answers to a peer that has gone or stopped reading (its queue
at the high-water mark) are dropped. One thread serves; each document is split in turn.

`health()` is the liveness probe's answer (/healthz on the metrics port): the serving loop
turns every `poll_ms` while idle and once per document, so a loop that has not turned for
`stuck_after_s` is stuck (a document that never ends), and the process is restarted; a TCP
probe would keep passing.
"""

import logging
import threading
import time
from dataclasses import dataclass, field

import zmq
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from common.tracing import context_from
from common.zmq_curve import CurveKeys
from common.zmq_router import bind_router, tcp_endpoint
from proto import k25_pb2
from services.chunker.boundaries import ChunkParams
from services.chunker.chunker import Chunker
from services.chunker.errors import ChunkerError, invalid_argument
from services.chunker.metrics import ChunkerMetrics
from services.chunker.wire import decode_request, error_response, params_of, response_of

log = logging.getLogger(__name__)
tracer = trace.get_tracer("k25.chunker")

LOG_FIRST_MALFORMED = 10
LOG_EVERY_MALFORMED = 1000
_ENVELOPE_BYTES = 64 << 10  # request fields besides the text


@dataclass(frozen=True)
class ChunkerSettings:
    port: int = 5600  # 0: any free port (see ChunkerServer.port)
    bind_host: str = "*"
    sndhwm: int = 5000
    rcvhwm: int = 5000
    linger_ms: int = 1000
    poll_ms: int = 100  # how often the loop looks at the stop event
    max_document_bytes: int = 8 << 20
    # a serving loop that has not turned for this long is stuck: /healthz answers 503. An
    # 8 MiB document is cut in seconds; this leaves room for a slow, shared CPU.
    stuck_after_s: float = 120.0
    curve_secret_key: CurveKeys | bytes | None = None  # the release's CURVE key(s): only their holders may connect
    defaults: ChunkParams = field(default_factory=ChunkParams)

    @property
    def max_frame_bytes(self) -> int:
        return 4 * self.max_document_bytes + _ENVELOPE_BYTES


class ChunkerServer:
    def __init__(self, chunker: Chunker, settings: ChunkerSettings = ChunkerSettings(), metrics: ChunkerMetrics | None = None):
        self.chunker = chunker
        self.settings = settings
        self.metrics = metrics or ChunkerMetrics()
        self._context = zmq.Context()
        self.socket, self.port, self._authenticator = bind_router(
            self._context, settings.bind_host, settings.port, settings.sndhwm, settings.rcvhwm, settings.linger_ms,
            {zmq.MAXMSGSIZE: settings.max_frame_bytes}, settings.curve_secret_key)
        self.malformed_frames = 0
        self.last_turn = time.monotonic()  # when the serving loop last came round

    def serve(self, stop: threading.Event) -> None:
        log.info("chunker listening on %s", tcp_endpoint(self.settings.bind_host, self.port))
        while not stop.is_set():
            self.last_turn = time.monotonic()
            if self.socket.poll(self.settings.poll_ms, zmq.POLLIN):
                self._handle(self.socket.recv_multipart())

    def health(self, now: float | None = None) -> dict:
        """The liveness probe's answer (common/metrics_http.py serves it at /healthz)."""
        return loop_health((time.monotonic() if now is None else now) - self.last_turn, self.settings.stuck_after_s)

    def _handle(self, frames: list[bytes]) -> None:
        identity, request_id = frames[0], ""
        try:
            if len(frames) != 2:
                raise invalid_argument(f"expected one ChunkRequest frame, got {len(frames) - 1} frames")
            request = decode_request(frames[1])
            request_id = request.request_id
            response = self._split(request)
        except ChunkerError as error:
            if error.code == "INVALID_ARGUMENT":
                self._log_malformed(identity, error)
            response = error_response(request_id, error)
        except Exception as exc:  # a bug handling one frame must not stop the server
            log.exception("failed to handle a frame from peer %s", identity.hex())
            response = error_response(request_id, ChunkerError("INTERNAL", f"chunker error: {exc}"))
        outcome = k25_pb2.ErrorCode.Name(response.error.code) if response.HasField("error") else "ok"
        self.metrics.requests.labels(outcome=outcome).inc()
        try:
            self.socket.send_multipart([identity, response.SerializeToString()], zmq.NOBLOCK)
        except zmq.Again:
            log.warning("dropped the answer to %r: peer %s is not reading", request_id, identity.hex())

    def _split(self, request: k25_pb2.ChunkRequest) -> k25_pb2.ChunkResponse:
        if request.deadline_unix_s and time.time() > request.deadline_unix_s:
            raise ChunkerError("DEADLINE_EXCEEDED", "the request's deadline passed before the chunker could take it; "
                                                    "nobody waits for this answer any more")
        params = params_of(request, self.settings.defaults)
        size = len(request.text.encode("utf-8"))
        if size > self.settings.max_document_bytes:
            raise invalid_argument(
                f"the document is {size} bytes; this chunker accepts at most {self.settings.max_document_bytes} "
                "(--max-document-bytes)"
            )
        started = time.perf_counter()
        parent = context_from(request.trace.traceparent, request.trace.tracestate)
        with tracer.start_as_current_span("k25.chunker.chunk", context=parent, kind=SpanKind.SERVER) as span:
            document = self.chunker.split(request.text, params)
            # the span's attribute names stay as dashboards know them: k25.chunk_size is the
            # passage budget, k25.chunks the number of passages
            span.set_attributes({"k25.request_id": request.request_id, "k25.document_bytes": size,
                                 "k25.chunk_size": params.passage_tokens, "k25.chunks": len(document.passages),
                                 "k25.document_tokens": document.total_tokens})
        self.metrics.duration.observe(time.perf_counter() - started)
        self.metrics.document_bytes.observe(size)
        self.metrics.passages.inc(len(document.passages))
        self.metrics.tokens.inc(document.total_tokens)
        log.debug("split %r: %d tokens, %d passages", request.request_id, document.total_tokens, len(document.passages))
        return response_of(request.request_id, document)

    def _log_malformed(self, identity: bytes, error: ChunkerError) -> None:
        self.malformed_frames += 1
        n = self.malformed_frames
        if n <= LOG_FIRST_MALFORMED or n % LOG_EVERY_MALFORMED == 0:
            log.warning("invalid request from peer %s (%d so far): %s", identity.hex(), n, error.message)

    def close(self) -> None:
        self.socket.close(linger=self.settings.linger_ms)
        if self._authenticator:
            self._authenticator.stop()
        self._context.term()


def loop_health(since_turn_s: float, stuck_after_s: float) -> dict:
    """Healthy while the serving loop came round within `stuck_after_s` seconds."""
    healthy = since_turn_s <= stuck_after_s
    body = {"healthy": healthy, "seconds_since_loop_turned": round(since_turn_s, 3)}
    if not healthy:
        body["reason"] = f"the serving loop has not turned for {since_turn_s:.0f} s (limit {stuck_after_s:g} s)"
    return body
