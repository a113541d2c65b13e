"""services.gateway.engine_client against a stand-in engine (a bare ROUTER in this test): each
frame is an EngineBatch whose messages go, in order, to the streams of their request ids, and a
frame or a message it cannot read is logged and dropped while the reader keeps serving."""

import asyncio
import logging

import zmq
import zmq.asyncio

from proto import k25_pb2
from services.gateway.engine_client import EngineConnection, EngineUnavailable


def delta(request_id: str, *token_ids: int) -> k25_pb2.EngineMessage:
    return k25_pb2.EngineMessage(delta=k25_pb2.TokenDelta(request_id=request_id, token_ids=token_ids))


def final(request_id: str) -> k25_pb2.EngineMessage:
    return k25_pb2.EngineMessage(final=k25_pb2.Final(request_id=request_id, finish_reason=k25_pb2.LENGTH))


def error(request_id: str, text: str) -> k25_pb2.EngineMessage:
    return k25_pb2.EngineMessage(error=k25_pb2.Error(request_id=request_id, code=k25_pb2.INVALID_ARGUMENT, message=text))


def frame(*messages: k25_pb2.EngineMessage) -> bytes:
    return k25_pb2.EngineBatch(messages=messages).SerializeToString()


async def serve_frames(frames: list[bytes]) -> dict[str, list[k25_pb2.EngineMessage]]:
    """Open r1 and r2 on a connection, send `frames` to it, return what each stream received."""
    context = zmq.asyncio.Context()
    engine = context.socket(zmq.ROUTER)
    engine.setsockopt(zmq.LINGER, 0)
    port = engine.bind_to_random_port("tcp://127.0.0.1")
    connection = EngineConnection(context, f"127.0.0.1:{port}", sndhwm=100, rcvhwm=100, linger_ms=0)
    try:
        streams = [await connection.submit(k25_pb2.GenerateRequest(request_id=rid), 10) for rid in ("r1", "r2")]
        for _ in streams:
            identity, _ = await asyncio.wait_for(engine.recv_multipart(), 10)
        for payload in frames:
            await engine.send_multipart([identity, payload])
        received = {}
        for stream in streams:
            received[stream.request_id] = []
            while not stream.finished:
                received[stream.request_id].append(await stream.next(timeout_s=10))
        return received
    finally:
        await connection.close()
        engine.close()
        context.term()


def test_every_message_of_a_frame_reaches_its_request_in_order():
    received = asyncio.run(serve_frames([
        frame(delta("r1", 1), delta("r2", 7)),
        frame(delta("r1", 2), delta("other", 9), final("r1"), delta("r2", 8)),
        frame(final("r2")),
    ]))
    assert [m.WhichOneof("kind") for m in received["r1"]] == ["delta", "delta", "final"]
    assert [t for m in received["r1"][:-1] for t in m.delta.token_ids] == [1, 2]
    assert [m.WhichOneof("kind") for m in received["r2"]] == ["delta", "delta", "final"]
    assert [t for m in received["r2"][:-1] for t in m.delta.token_ids] == [7, 8]


def test_unreadable_frames_and_messages_are_logged_and_dropped_and_the_reader_goes_on(caplog):
    caplog.set_level(logging.WARNING, logger="services.gateway.engine_client")
    received = asyncio.run(serve_frames([
        b"\x00garbage",  # field number 0 never parses
        b"\x0a\xff",  # a message whose length runs past the end
        frame(k25_pb2.EngineMessage()),  # a message that is neither delta, final nor error
        frame(error("", "frame is not a k25.v1.ClientMessage")),  # an error about no request
        frame(delta("r1", 1), final("r1"), error("r2", "bad request")),
    ]))
    assert [m.WhichOneof("kind") for m in received["r1"]] == ["delta", "final"]
    assert [m.error.message for m in received["r2"]] == ["bad request"]
    logged = caplog.text
    assert logged.count("unreadable frame from engine") == 2
    assert "a message with no kind" in logged
    assert "frame is not a k25.v1.ClientMessage" in logged


async def with_connection(engine_hwm: int, body):
    """`body(connection, engine)` with a connection to a bare ROUTER that reads nothing unless told."""
    context = zmq.asyncio.Context()
    engine = context.socket(zmq.ROUTER)
    engine.setsockopt(zmq.LINGER, 0)
    engine.setsockopt(zmq.RCVHWM, engine_hwm)
    port = engine.bind_to_random_port("tcp://127.0.0.1")
    connection = EngineConnection(context, f"127.0.0.1:{port}", sndhwm=1, rcvhwm=100, linger_ms=0)
    try:
        return await body(connection, engine)
    finally:
        await connection.close()
        engine.close()
        context.term()


def test_a_cancel_that_lands_with_a_message_stops_the_reader_of_the_stream():
    """The item and the cancel arrive in the same loop turn: the reader is cancelled all the same
    (asyncio.wait_for on Python 3.11 returned the item and dropped the cancel)."""
    async def body(connection, engine):
        stream = await connection.submit(k25_pb2.GenerateRequest(request_id="r1"), 10)
        reader = asyncio.create_task(stream.next(timeout_s=60))
        await asyncio.sleep(0)  # the reader waits on the queue
        stream.queue.put_nowait(delta("r1", 1))
        reader.cancel()
        try:
            await reader
        except asyncio.CancelledError:
            return "cancelled"
        return "returned the item"

    assert asyncio.run(with_connection(100, body)) == "cancelled"


def test_a_request_the_engine_cannot_take_now_is_refused_not_lost():
    """An engine that reads nothing fills the queue: submit then raises EngineUnavailable (the
    asyncio socket's send had put the refusal in a future nobody read)."""
    async def body(connection, engine):
        payload = list(range(20_000))  # ~60 KB a request: the socket buffers fill within a few hundred
        for n in range(2_000):
            try:
                await connection.submit(k25_pb2.GenerateRequest(request_id=f"r{n}", prompt_token_ids=payload), 10)
            except EngineUnavailable as refused:
                return n, str(refused), f"r{n}" in connection.streams
        return None

    refused = asyncio.run(with_connection(1, body))
    assert refused is not None, "2,000 requests queued to an engine that reads nothing"
    taken, message, left_open = refused
    assert taken > 0 and "refused the message" in message and not left_open
