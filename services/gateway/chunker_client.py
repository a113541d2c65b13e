"""An asyncio client of the chunker service, for the gateway.

One DEALER socket carries any number of concurrent requests; a single reader task matches
each ChunkResponse to its caller by request_id.

    client = ChunkerClient("tcp://chunker:5600")
    split = await client.chunk(text, passage_tokens=512, overlap_ratio=0.1, semantic_threshold=0.5,
                               traceparent=traceparent)
    for passage in split.chunks: ...        # k25_pb2.Chunk: start_char, end_char, start_token, end_token, anchor
    client.close()

It speaks only the wire contract (proto's ChunkRequest and ChunkResponse), so the gateway
needs nothing of the chunker's code. A request whose connection dropped before its answer came
(the chunker pod stopped or was replaced) is sent again once the socket has reconnected (to the
same chunker or, behind a Service, another): cutting a document is idempotent, and an answer that
comes twice is taken once. proto keeps the chunker's names: each `Chunk` message is
one passage of the document, and ChunkRequest.chunk_size is a passage's token budget. A refusal raises ChunkerError with the service's code (e.g. INVALID_ARGUMENT for a document
above its size limit); no answer within `timeout_s` raises ChunkerError(DEADLINE_EXCEEDED).
"""

import asyncio
import logging
import time
import uuid

import zmq
import zmq.asyncio
from google.protobuf.message import DecodeError
from zmq.utils.monitor import parse_monitor_message

from common.zmq_curve import CurveKeys, ServerKeyChoice, make_client
from proto import k25_pb2

log = logging.getLogger(__name__)


class ChunkerError(Exception):
    """The chunker refused (code: a k25.v1.ErrorCode name) or could not be reached in time."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class ChunkerClient:
    def __init__(self, address: str, timeout_s: float = 30.0, sndhwm: int = 5000, rcvhwm: int = 5000,
                 curve_secret_key: CurveKeys | bytes | None = None):
        self.address = address
        self.timeout_s = timeout_s
        self._context = zmq.asyncio.Context()
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, sndhwm)
        self._socket.setsockopt(zmq.RCVHWM, rcvhwm)
        self._server_keys = ServerKeyChoice(curve_secret_key) if curve_secret_key else None
        if self._server_keys:
            make_client(self._socket, curve_secret_key, self._server_keys.server_public_key)
            if len(self._server_keys.candidates) > 1:
                # a CURVE rotation: a chunker may hold either key, and a failed handshake tries the
                # other; only a finished handshake takes messages, so none waits on a dead attempt
                self._socket.setsockopt(zmq.IMMEDIATE, 1)
        self._monitor = self._socket.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | ServerKeyChoice.EVENTS)
        self._socket.connect(address)
        self._pending: dict[str, tuple[asyncio.Future, bytes]] = {}  # request_id -> its answer, the frame sent
        self._dropped = False  # the connection dropped: what was sent on it may never be answered
        self._reader: asyncio.Task | None = None
        self._watcher: asyncio.Task | None = None

    async def chunk(
        self, text: str, passage_tokens: int = 0, overlap_ratio: float | None = None,
        semantic_threshold: float | None = None, traceparent: str = "", tracestate: str = "",
    ) -> k25_pb2.ChunkResponse:
        """The document cut into passages by the chunker; 0 or None parameters take the service's defaults."""
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._read())
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.create_task(self._watch_connection())
        request_id = uuid.uuid4().hex
        request = k25_pb2.ChunkRequest(
            request_id=request_id, text=text, chunk_size=passage_tokens, overlap_ratio=overlap_ratio,
            semantic_threshold=semantic_threshold,
            trace=k25_pb2.TraceContext(traceparent=traceparent, tracestate=tracestate),
            # the gateway gives up then: a request queued while the chunker was down is not cut after it
            deadline_unix_s=time.time() + self.timeout_s,
        )
        answer = asyncio.get_running_loop().create_future()
        payload = request.SerializeToString()
        self._pending[request_id] = (answer, payload)
        try:
            async with asyncio.timeout(self.timeout_s):  # not wait_for: it can drop a cancel (engine_client.py)
                response = await self._exchange(payload, answer)
        except TimeoutError:
            raise ChunkerError("DEADLINE_EXCEEDED", f"no answer from the chunker at {self.address} within {self.timeout_s} s") from None
        finally:
            self._pending.pop(request_id, None)
        if response.HasField("error"):
            raise ChunkerError(k25_pb2.ErrorCode.Name(response.error.code), response.error.message)
        return response

    async def _exchange(self, payload: bytes, answer: asyncio.Future) -> k25_pb2.ChunkResponse:
        await self._socket.send(payload)  # waits while this socket's queue is at its high-water mark
        return await answer

    async def _read(self) -> None:
        while True:
            payload = await self._socket.recv()
            try:
                response = k25_pb2.ChunkResponse.FromString(payload)
            except DecodeError:
                log.warning("ignored a frame from %s that is not a ChunkResponse", self.address)
                continue
            answer, _ = self._pending.get(response.request_id, (None, b""))
            if answer is not None and not answer.done():
                answer.set_result(response)

    async def _watch_connection(self) -> None:
        while True:
            event = parse_monitor_message(await self._monitor.recv_multipart())["event"]
            if event == zmq.EVENT_DISCONNECTED:
                self._dropped = True
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED and self._dropped:
                self._dropped = False
                waiting = [payload for answer, payload in self._pending.values() if not answer.done()]
                if waiting:
                    log.warning("the connection to the chunker at %s dropped with %d requests unanswered; sent again",
                                self.address, len(waiting))
                for payload in waiting:
                    await self._socket.send(payload)
            elif self._server_keys and self._server_keys.switch(self._socket, self.address, event):
                log.info("the chunker at %s refused the CURVE handshake: dialling it with the rotation's other key",
                         self.address)

    def close(self) -> None:
        """Fail what is still waiting with CANCELLED and close the socket."""
        for task in (self._reader, self._watcher):
            if task is not None:
                task.cancel()
        self._socket.disable_monitor()
        self._monitor.close(linger=0)
        for answer, _ in self._pending.values():
            if not answer.done():
                answer.set_exception(ChunkerError("CANCELLED", "the chunker client was closed"))
        self._socket.close(linger=0)
        self._context.term()
