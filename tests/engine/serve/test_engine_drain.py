"""Draining, driven in-process one `run_once` at a time with real DEALER peers, so that what is
running, waiting or finished when the drain begins follows from the steps the test drives,
not from timing. (`k25 engine` under real signals: test_engine_shutdown.py.)"""

import threading
import time

import pytest

from engine.base.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.serve.server import EngineServer, ServerSettings
from proto import k25_pb2
from tests.helpers.engine_process import dealer, generate_message, receive, receive_until_done, request_id_of, send, wait_until

CHUNK = 32


def engine_server(tiny_model, hang_up_wait_s: float, peer) -> EngineServer:
    engine = LLMEngine(tiny_model, EngineConfig(chunk_size=CHUNK, max_chunk_per_gpu=64, max_num_seqs=1))
    server = EngineServer(engine, ServerSettings(port=0, bind_host="127.0.0.1", idle_poll_ms=10,
                                                 hang_up_wait_s=hang_up_wait_s))
    server.peer = peer(f"tcp://127.0.0.1:{server.port}")
    return server


@pytest.fixture
def server(tiny_model):
    # the test's peer reads only once the drain has returned: the engine does not wait for it to hang up
    server = engine_server(tiny_model, 0, dealer)
    yield server
    server.peer.close()
    if not server.socket.closed:
        server.close()


@pytest.fixture(scope="module")
def prompt(tiny_model) -> list[int]:
    return tiny_model.tokenizer.encode("The contract says that the tenant")


def drive_until(server: EngineServer, condition, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout_s} s")
        server.run_once()


def start(server: EngineServer, prompt: list[int], max_tokens: int) -> str:
    message = generate_message(prompt, CHUNK, max_tokens=max_tokens, ignore_eos=True)
    send(server.peer, message)
    return message.generate.request_id


def receive_all(peer, request_ids: list[str]) -> dict[str, list[k25_pb2.EngineMessage]]:
    """Each request's messages, up to its Final or Error."""
    answers, open_ids = {request_id: [] for request_id in request_ids}, set(request_ids)
    while open_ids:
        message = receive(peer, timeout_s=30)
        request_id = request_id_of(message)
        answers[request_id].append(message)
        if message.WhichOneof("kind") != "delta":
            open_ids.discard(request_id)
    return answers


def cancelled(server: EngineServer) -> float:
    return server.metrics.registry.get_sample_value("k25_engine_request_errors_total", {"code": "CANCELLED"}) or 0


def streaming(server: EngineServer, prompt: list[int], max_tokens: int = 1000) -> str:
    """A request that has streamed tokens and has many more to go."""
    request_id = start(server, prompt, max_tokens)
    drive_until(server, lambda: request_id in server._routes and server._routes[request_id].last_token_at is not None,
                "the request streaming")
    return request_id


def test_the_drain_refuses_new_work_hands_back_queued_requests_and_lets_running_ones_finish(server, prompt):
    running = start(server, prompt, 12)
    queued = start(server, prompt, 5)  # max_num_seqs=1: it waits for its first step
    drive_until(server, lambda: server.engine.num_running == 1 and server.engine.num_waiting == 1, "one running, one queued")

    server.begin_drain()
    late = start(server, prompt, 5)
    drive_until(server, lambda: cancelled(server) == 2, "the late request refused")  # and the queued one handed back
    server.drain(timeout_s=600)

    assert server.socket.closed
    answers = receive_all(server.peer, [running, queued, late])
    (handed_back,) = answers[queued]
    assert handed_back.error.code == k25_pb2.CANCELLED and "before this request started" in handed_back.error.message
    (refused,) = answers[late]
    assert refused.error.code == k25_pb2.CANCELLED and "draining" in refused.error.message
    finished = answers[running]
    assert finished[-1].final.finish_reason == k25_pb2.LENGTH and finished[-1].final.usage.completion_tokens == 12
    assert sum(len(m.delta.token_ids) for m in finished[:-1]) == 12


@pytest.mark.parametrize("timeout_s, hurry, why", [
    (0, lambda: False, "its drain timeout of 0 s passed"),
    (600, lambda: True, "a second stop signal ended its drain"),
])
def test_what_still_runs_when_the_drain_ends_is_cancelled_never_cut_silently(server, prompt, timeout_s, hurry, why):
    request_id = streaming(server, prompt)

    server.drain(timeout_s, hurry)

    messages = receive_until_done(server.peer, request_id)
    assert [m.WhichOneof("kind") for m in messages[:-1]] == ["delta"] * (len(messages) - 1) and len(messages) > 1
    last = messages[-1]
    assert last.error.code == k25_pb2.CANCELLED and why in last.error.message and "incomplete" in last.error.message
    blocks = server.engine.block_manager
    assert server.engine.num_running == 0 and blocks.num_free_blocks == blocks.num_blocks  # its KV is free


def test_an_idle_engine_drains_at_once(server):
    server.drain(timeout_s=600)  # nothing runs: no wait
    assert server.socket.closed and server.draining


def test_a_drained_engine_closes_only_once_its_peer_has_hung_up_so_no_answer_is_lost(tiny_model, prompt):
    """A gateway reads the last answer a moment after the engine sent it; had the engine closed
    first, its DEALER (ZMQ_IMMEDIATE) would have dropped it and the stream ended engine_lost."""
    server = engine_server(tiny_model, 600, lambda address: dealer(address, immediate=True))
    try:
        request_id = streaming(server, prompt, max_tokens=8)
        draining = threading.Thread(target=server.drain, args=(600,))
        draining.start()
        wait_until(lambda: request_id not in server._routes, timeout_s=60, what="the answer finished and sent")
        # an engine that closed once its answers were out would have done so now; this one waits for
        # its peer (600 s), so the thread cannot end here, however fast or slow the machine
        draining.join(timeout=1)
        assert draining.is_alive() and not server.socket.closed

        messages = receive_until_done(server.peer, request_id)
        assert messages[-1].final.finish_reason == k25_pb2.LENGTH and messages[-1].final.usage.completion_tokens == 8
        server.peer.close()  # as a gateway does once the engine left the registry and its streams are done
        draining.join(timeout=60)
        assert not draining.is_alive() and server.socket.closed
    finally:
        server.peer.close()
        if not server.socket.closed:
            server.close()


def test_a_peer_that_never_hangs_up_holds_the_close_only_for_hang_up_wait_s(tiny_model, prompt):
    server = engine_server(tiny_model, 0.2, lambda address: dealer(address, immediate=True))
    try:
        streaming(server, prompt, max_tokens=4)
        server.drain(timeout_s=600)  # returns although the peer never hangs up
        assert server.socket.closed and server.engine.num_running == 0
    finally:
        server.peer.close()
