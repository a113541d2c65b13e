"""The gateway's side of the engine wire: one ZMQ DEALER per engine, shared by all requests.

A reader task reads the engine's frames, each an EngineBatch (every message of one engine
step for this gateway's requests), and hands each EngineMessage in it, in order, to the
stream of its request_id; a frame it cannot read is logged and dropped. The socket's
monitor tells when the engine's connection drops (the process died, or ZMQ's own
heartbeat found it hung): once the frames already received are handed over (and those that
come within DISCONNECT_GRACE_S while a request has no answer yet), every stream still open on
it gets ENGINE_GONE, so no request waits forever on an engine that is not there. Sends never block: with ZMQ_IMMEDIATE a
message is only queued on a live connection, and a full queue is a refusal the caller
can take elsewhere.
"""

import asyncio
import logging
import time

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from common.zmq_curve import CurveKeys, ServerKeyChoice, make_client
from proto import k25_pb2

log = logging.getLogger(__name__)

# put on a stream when the engine's connection drops
ENGINE_GONE = object()
# after a drop, how long frames of the closed connection may still arrive while a request is
# unanswered: ZMQ reports the drop on the monitor's pipe, which can overtake the data's; a dead
# engine's requests fail this much later. (What this socket had received but not handed over when
# the drop came is gone: ZMQ_IMMEDIATE drops it; an engine therefore closes after its peers hang
# up, engine/serve/peers.py.)
DISCONNECT_GRACE_S = 1.0


class EngineUnavailable(Exception):
    """The engine cannot take a message now (not connected, or its queue is full)."""


class EngineStream:
    """The responses to one request: EngineMessages, then possibly ENGINE_GONE."""

    def __init__(self, connection: "EngineConnection", request_id: str):
        self.connection = connection
        self.request_id = request_id
        self.queue: asyncio.Queue = asyncio.Queue()
        self.finished = False  # a Final or Error arrived, or the engine went away
        self.answered = False  # a Final or Error is in the queue

    async def next(self, timeout_s: float | None):
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns the item and drops a
        # cancel that lands in the loop turn the item arrives in, so a request whose client
        # left (or whose sibling note failed) would stream on to its end
        async with asyncio.timeout(timeout_s):
            item = await self.queue.get()
        if item is ENGINE_GONE or item.WhichOneof("kind") in ("final", "error"):
            self.finished = True
        return item

    def close(self) -> None:
        """Stop listening; if the engine may still be working on it, tell it to stop."""
        if not self.finished:
            self.connection.cancel(self.request_id)
            self.finished = True
        self.connection.streams.pop(self.request_id, None)


class EngineConnection:
    def __init__(self, context: zmq.asyncio.Context, address: str, sndhwm: int, rcvhwm: int, linger_ms: int,
                 curve_secret_key: CurveKeys | bytes | None = None):
        self.address = address
        self.streams: dict[str, EngineStream] = {}
        self.connected = asyncio.Event()
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.SNDHWM, sndhwm)
        self.socket.setsockopt(zmq.RCVHWM, rcvhwm)
        self.socket.setsockopt(zmq.LINGER, linger_ms)
        self.socket.setsockopt(zmq.IMMEDIATE, 1)
        # ZMQ's own pings find an engine that hangs without closing its socket
        self.socket.setsockopt(zmq.HEARTBEAT_IVL, 1000)
        self.socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, 5000)
        self.socket.setsockopt(zmq.RECONNECT_IVL, 200)
        # during a CURVE rotation the engine may hold either key: a failed handshake tries the other
        self._server_keys = ServerKeyChoice(curve_secret_key) if curve_secret_key else None
        if self._server_keys:
            make_client(self.socket, curve_secret_key, self._server_keys.server_public_key)
        self._monitor = self.socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
                                                       | ServerKeyChoice.EVENTS)
        self.socket.connect(f"tcp://{address}")
        self._tasks = [asyncio.create_task(self._pump())]

    async def submit(self, request: k25_pb2.GenerateRequest, connect_timeout_s: float) -> EngineStream:
        if request.request_id in self.streams:
            raise ValueError(f"request {request.request_id} is already open on {self.address}")
        try:
            async with asyncio.timeout(connect_timeout_s):
                await self.connected.wait()
        except TimeoutError:
            raise EngineUnavailable(f"engine {self.address} is not connected") from None
        stream = EngineStream(self, request.request_id)
        self.streams[request.request_id] = stream
        try:
            self._send_now(k25_pb2.ClientMessage(generate=request).SerializeToString())
        except zmq.ZMQError as exc:
            del self.streams[request.request_id]
            raise EngineUnavailable(f"engine {self.address} refused the message: {exc}") from None
        return stream

    def cancel(self, request_id: str) -> None:
        """Best effort and never blocking: the engine also aborts requests of a vanished peer."""
        message = k25_pb2.ClientMessage(cancel=k25_pb2.CancelRequest(request_id=request_id))
        try:
            self._send_now(message.SerializeToString())
        except zmq.ZMQError as exc:
            log.warning("could not send cancel for %s to %s: %s", request_id, self.address, exc)

    def _send_now(self, payload: bytes) -> None:
        """Send without waiting; raises zmq.ZMQError when the socket cannot take it now. The
        asyncio socket's send never raises: a refused NOBLOCK send is the exception of the future
        it returns, done at once (no send ever waits here, so none is queued before it). It must
        stay that socket's send: another socket over the same one would leave the reader asleep
        on messages already in (ZMQ's descriptor signals edges, and only the asyncio socket's own
        sends look again)."""
        sent = self.socket.send(payload, zmq.NOBLOCK)
        if sent.done() and sent.exception() is not None:
            raise sent.exception()

    async def _pump(self) -> None:
        """One task reads both the engine's frames and the monitor's events, frames first: an
        engine that finishes its last answers and then closes (a drain) sends those frames
        before its disconnect, and they must reach their streams before ENGINE_GONE does."""
        frame = event = None
        try:
            while True:
                frame = frame or self.socket.recv()
                event = event or self._monitor.recv_multipart()
                done, _ = await asyncio.wait((frame, event), return_when=asyncio.FIRST_COMPLETED)
                if frame in done:
                    self._deliver_frame(frame.result())
                    frame = None
                    continue
                parsed = parse_monitor_message(event.result())
                event = None
                if parsed["event"] == zmq.EVENT_DISCONNECTED:
                    frame = await self._frames_after_the_drop(frame)
                self._handle_event(parsed)
        finally:
            for pending in (frame, event):
                if pending is not None:
                    pending.cancel()

    async def _frames_after_the_drop(self, frame: asyncio.Future) -> asyncio.Future:
        """Deliver the frames that come within DISCONNECT_GRACE_S while some open request has
        no answer yet; returns the read still pending."""
        deadline = time.monotonic() + DISCONNECT_GRACE_S
        while any(not stream.answered for stream in self.streams.values()):
            done, _ = await asyncio.wait((frame,), timeout=deadline - time.monotonic())
            if not done:
                break
            self._deliver_frame(frame.result())
            frame = self.socket.recv()
        return frame

    def _deliver_frame(self, payload: bytes) -> None:
        batch = k25_pb2.EngineBatch()
        try:
            batch.ParseFromString(payload)
        except Exception:  # a frame we cannot read must not stop the reader
            log.warning("unreadable frame from engine %s (%d bytes)", self.address, len(payload))
            return
        for message in batch.messages:
            self._deliver(message)

    def _deliver_waiting_frames(self) -> None:
        """Every frame already in the socket, now (a non-blocking read; the pending one in
        _pump is not done, or it would have been handled first)."""
        while True:
            received = self.socket.recv(zmq.NOBLOCK)
            if received.exception() is not None:
                return  # zmq.Again: none left
            self._deliver_frame(received.result())

    def _deliver(self, message: k25_pb2.EngineMessage) -> None:
        kind = message.WhichOneof("kind")
        if kind is None:
            log.warning("engine %s sent a message with no kind; dropped", self.address)
            return
        request_id = getattr(message, kind).request_id
        stream = self.streams.get(request_id)
        if stream is not None:
            stream.queue.put_nowait(message)
            stream.answered = stream.answered or kind in ("final", "error")
        elif kind == "error" and not request_id:
            log.warning("engine %s: %s", self.address, message.error.message)

    def _handle_event(self, event: dict) -> None:
        if self._server_keys and self._server_keys.switch(self.socket, f"tcp://{self.address}", event["event"]):
            log.info("engine %s refused the CURVE handshake: dialling it with the rotation's other key", self.address)
        elif event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.connected.set()
        elif event["event"] == zmq.EVENT_DISCONNECTED:
            self.connected.clear()
            self._deliver_waiting_frames()
            if self.streams:
                log.warning("engine %s disconnected with %d open requests", self.address, len(self.streams))
            for stream in list(self.streams.values()):
                stream.queue.put_nowait(ENGINE_GONE)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for stream in list(self.streams.values()):
            stream.queue.put_nowait(ENGINE_GONE)
        self.socket.disable_monitor()
        self._monitor.close(linger=0)
        self.socket.close()


class EngineConnections:
    """A connection per engine address, opened on first use and closed when the engine leaves."""

    def __init__(self, sndhwm: int = 5000, rcvhwm: int = 5000, linger_ms: int = 1000,
                 curve_secret_key: CurveKeys | bytes | None = None):
        self.context = zmq.asyncio.Context()
        self.sndhwm, self.rcvhwm, self.linger_ms = sndhwm, rcvhwm, linger_ms
        self.curve_secret_key = curve_secret_key
        self.by_address: dict[str, EngineConnection] = {}

    def open_requests(self, address: str) -> int:
        connection = self.by_address.get(address)
        return len(connection.streams) if connection is not None else 0

    def get(self, address: str) -> EngineConnection:
        connection = self.by_address.get(address)
        if connection is None:
            connection = EngineConnection(self.context, address, self.sndhwm, self.rcvhwm, self.linger_ms,
                                          self.curve_secret_key)
            self.by_address[address] = connection
        return connection

    async def retain(self, live_addresses: set[str]) -> None:
        """Close connections to engines that left the registry and have nothing in flight."""
        for address, connection in list(self.by_address.items()):
            if address not in live_addresses and not connection.streams:
                del self.by_address[address]
                await connection.close()

    async def close(self) -> None:
        for connection in self.by_address.values():
            await connection.close()
        self.by_address.clear()
        self.context.term()
