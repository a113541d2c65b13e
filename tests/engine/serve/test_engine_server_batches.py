"""One frame per peer per engine step: the server driven in-process, one `run_once` at a time,
with real DEALER peers. Every frame is an EngineBatch holding that step's messages for that
peer's requests only; the counts below follow from the steps the test drives, not from timing."""

import time

import pytest

from engine.base.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.serve.server import EngineServer, ServerSettings
from proto import k25_pb2
from tests.helpers.engine_process import dealer, generate_message, receive_batch, request_id_of, send

CHUNK = 32
STEPS_TOGETHER = 5  # steps driven while every request runs


@pytest.fixture
def server(tiny_model):
    engine = LLMEngine(tiny_model, EngineConfig(chunk_size=CHUNK, max_chunk_per_gpu=64))
    server = EngineServer(engine, ServerSettings(port=0, bind_host="127.0.0.1", idle_poll_ms=10))
    peers = []

    def peer():
        socket = dealer(f"tcp://127.0.0.1:{server.port}")
        peers.append(socket)
        return socket

    server.peer = peer
    yield server
    for socket in peers:
        socket.close()
    if not server.socket.closed:
        server.close()


def drive_until(server: EngineServer, condition, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout_s} s")
        server.run_once()


def start(server: EngineServer, socket, prompt: list[int], pad_token_id: int) -> str:
    """A request that keeps decoding (one token per step) until it is cancelled."""
    message = generate_message(prompt, CHUNK, pad_token_id, max_tokens=200, ignore_eos=True)
    send(socket, message)
    return message.generate.request_id


def run_together(server: EngineServer, running: int) -> None:
    """Step until `running` requests decode side by side, then STEPS_TOGETHER more steps."""
    drive_until(server, lambda: server.engine.num_running == running, f"{running} requests running")
    for _ in range(STEPS_TOGETHER):
        assert server.engine.has_unfinished()
        server.run_once()  # it steps: nothing is waiting to be sent to a slow peer here


def cancel_all(server: EngineServer, cancels: dict) -> None:
    for socket, request_ids in cancels.items():
        for request_id in request_ids:
            send(socket, k25_pb2.ClientMessage(cancel=k25_pb2.CancelRequest(request_id=request_id)))
    drive_until(server, lambda: not server.engine.has_unfinished(), "every request cancelled")
    server.run_once()  # flushes anything a peer could not take at once


def frames_until_done(socket, request_ids: list[str]) -> list[list[k25_pb2.EngineMessage]]:
    """Every frame this peer receives until each request has its Final or Error."""
    frames, open_ids = [], set(request_ids)
    while open_ids:
        frame = receive_batch(socket, timeout_s=30)
        assert frame, "the engine sent an empty frame"
        frames.append(frame)
        open_ids -= {request_id_of(m) for m in frame if m.WhichOneof("kind") in ("final", "error")}
    return frames


def delta_ids(frame: list[k25_pb2.EngineMessage]) -> list[str]:
    return [m.delta.request_id for m in frame if m.WhichOneof("kind") == "delta"]


@pytest.fixture
def prompts(tiny_model):
    encode = tiny_model.tokenizer.encode
    return [encode("The contract says that the tenant"), encode("Once upon a time"), encode("A long document about leases")]


def test_concurrent_requests_of_one_peer_share_one_frame_per_step(server, tiny_model, prompts):
    peer = server.peer()
    pad = tiny_model.tokenizer.pad_token_id
    ids = [start(server, peer, prompt, pad) for prompt in prompts[:2]]

    run_together(server, running=2)
    cancel_all(server, {peer: ids})
    frames = frames_until_done(peer, ids)

    for frame in frames:  # a step gives a request at most one delta, and a frame is one step
        assert len(delta_ids(frame)) == len(set(delta_ids(frame)))
    together = [frame for frame in frames if sorted(delta_ids(frame)) == sorted(ids)]
    assert len(together) >= STEPS_TOGETHER
    messages = [m for frame in frames for m in frame]
    for request_id in ids:  # each request still reads as deltas then one Final (ABORT), in order
        own = [m for m in messages if request_id_of(m) == request_id]
        assert {m.WhichOneof("kind") for m in own[:-1]} == {"delta"}
        assert own[-1].final.finish_reason == k25_pb2.ABORT
        assert own[-1].final.usage.completion_tokens == sum(len(m.delta.token_ids) for m in own[:-1])


def test_two_peers_each_get_one_frame_per_step_with_only_their_own_messages(server, tiny_model, prompts):
    first, second = server.peer(), server.peer()
    pad = tiny_model.tokenizer.pad_token_id
    first_ids = [start(server, first, prompt, pad) for prompt in prompts[:2]]
    second_ids = [start(server, second, prompts[2], pad)]

    run_together(server, running=3)
    cancel_all(server, {first: first_ids, second: second_ids})

    for peer, own_ids in ((first, first_ids), (second, second_ids)):
        frames = frames_until_done(peer, own_ids)
        assert {request_id_of(m) for frame in frames for m in frame} == set(own_ids)
        for frame in frames:
            assert len(delta_ids(frame)) == len(set(delta_ids(frame)))
        assert len([frame for frame in frames if sorted(delta_ids(frame)) == sorted(own_ids)]) >= STEPS_TOGETHER


def test_shutdown_cancels_each_peers_requests_in_one_frame(server, tiny_model, prompts):
    first, second = server.peer(), server.peer()
    pad = tiny_model.tokenizer.pad_token_id
    first_ids = [start(server, first, prompt, pad) for prompt in prompts[:2]]
    second_ids = [start(server, second, prompts[2], pad)]
    drive_until(server, lambda: server.engine.num_running == 3, "3 requests running")

    server.close()

    for peer, own_ids in ((first, first_ids), (second, second_ids)):
        last = frames_until_done(peer, own_ids)[-1]
        assert sorted(m.error.request_id for m in last) == sorted(own_ids)
        assert {m.error.code for m in last} == {k25_pb2.CANCELLED}
