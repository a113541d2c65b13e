"""`k25 chunker` as a real process, reached over real ZMQ sockets and by the asyncio client."""

import asyncio
import random
import signal
import time
import uuid

import pytest
import zmq

from common.tokenizer import load_tokenizer
from proto import k25_pb2
from services.chunker.boundaries import ChunkParams
from services.chunker.chunker import Chunker
from services.chunker.wire import build_request
from services.gateway.chunker_client import ChunkerClient, ChunkerError
from tests.helpers.chunker_process import DEFAULTS, MAX_DOCUMENT_BYTES, start_chunker
from tests.helpers.engine_process import dealer
from tests.helpers.http_json import get_json
from tests.helpers.paths import CONTRACTS
from tests.helpers.redis_server import free_port

pytestmark = pytest.mark.slow  # starts real processes

OVER_THE_LIMIT = "条" * (MAX_DOCUMENT_BYTES // 3 + 1)  # a third as many characters as the limit's bytes, 3 bytes each


@pytest.fixture(scope="module")
def chunker(tmp_path_factory):
    handle = start_chunker(tmp_path_factory.mktemp("chunker") / "chunker.log")
    yield handle
    handle.process.terminate()
    handle.process.wait(timeout=30)


@pytest.fixture(scope="module")
def library():
    return Chunker(load_tokenizer("smollm2-135m"))


def ask(socket: zmq.Socket, request: k25_pb2.ChunkRequest, timeout_s: float = 30) -> k25_pb2.ChunkResponse:
    socket.send(request.SerializeToString())
    return receive(socket, timeout_s)


def receive(socket: zmq.Socket, timeout_s: float = 30) -> k25_pb2.ChunkResponse:
    if not socket.poll(int(timeout_s * 1000), zmq.POLLIN):
        raise TimeoutError(f"no answer from the chunker within {timeout_s} s")
    return k25_pb2.ChunkResponse.FromString(socket.recv())


def contract(name: str) -> str:
    return (CONTRACTS / name).read_text(encoding="utf-8")


def spans(passages) -> list[tuple[int, int, int, int, str]]:
    """Passages (proto Chunk messages or the library's Passage) as comparable tuples."""
    return [(p.start_char, p.end_char, p.start_token, p.end_token, p.anchor) for p in passages]


def test_answers_what_the_library_computes(chunker, library):
    text = contract("zh_equity_transfer.txt")
    client = dealer(chunker.address)
    response = ask(client, build_request("r1", text, 256, 0.1, 0.5, traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01"))
    client.close()
    expected = library.split(text, ChunkParams(256, 0.1, 0.5))
    assert not response.HasField("error")
    assert response.request_id == "r1" and response.total_tokens == expected.total_tokens
    assert spans(response.chunks) == spans(expected.passages)


def test_unset_fields_take_the_service_defaults(chunker, library):
    text = contract("en_10k_risk_factors.txt")
    client = dealer(chunker.address)
    defaulted = ask(client, build_request("d", text))
    no_overlap = ask(client, build_request("z", text, overlap_ratio=0.0))
    client.close()
    assert spans(defaulted.chunks) == spans(library.split(text, DEFAULTS).passages)
    assert max(p.end_token - p.start_token for p in defaulted.chunks) <= DEFAULTS.passage_tokens
    starts_and_ends = list(zip(no_overlap.chunks[1:], no_overlap.chunks))
    assert all(after.start_token == before.end_token for after, before in starts_and_ends)


def malformed_frames(count: int):
    """Frames that are not one valid ChunkRequest, of every kind the service must survive."""
    rng = random.Random(0)
    kinds = [
        lambda: [rng.randbytes(rng.randrange(1, 64))],  # random bytes
        lambda: [b"\x00" + rng.randbytes(rng.randrange(0, 32))],  # field number 0 never parses
        lambda: [b""],  # parses as an empty request: no request_id
        lambda: [build_request("", "text without an id").SerializeToString()],
        lambda: [build_request("two", "x").SerializeToString(), b"second frame"],
        lambda: [build_request(uuid.uuid4().hex, "x", passage_tokens=3).SerializeToString()],
        lambda: [build_request(uuid.uuid4().hex, "x", overlap_ratio=float("nan")).SerializeToString()],
        lambda: [b"\x0a\x01r\x12\x02\xc3\x28"],  # request_id "r", text with invalid UTF-8
    ]
    for i in range(count):
        yield kinds[i % len(kinds)]()


def test_a_thousand_malformed_frames_are_each_answered_and_the_service_keeps_serving(chunker):
    client = dealer(chunker.address)
    before = chunker.metrics().get(("k25_chunker_requests_total", (("outcome", "INVALID_ARGUMENT"),)), 0)
    for frames in malformed_frames(1000):
        client.send_multipart(frames)
    answers = [receive(client) for _ in range(1000)]
    assert all(a.error.code == k25_pb2.INVALID_ARGUMENT and a.error.message for a in answers)
    assert sum(a.error.message.startswith("expected one ChunkRequest frame") for a in answers) == 125

    fine = ask(client, build_request("after", "第一条 总则。"))
    client.close()
    assert not fine.HasField("error") and fine.request_id == "after" and len(fine.chunks) == 1
    after = chunker.metrics()[("k25_chunker_requests_total", (("outcome", "INVALID_ARGUMENT"),))]
    assert after - before == 1000
    assert chunker.process.poll() is None


def test_documents_over_the_limit_are_refused_by_their_utf8_size(chunker):
    client = dealer(chunker.address)
    at_limit = ask(client, build_request("ok", "a" * MAX_DOCUMENT_BYTES))
    over = ask(client, build_request("big", OVER_THE_LIMIT))
    client.close()
    assert not at_limit.HasField("error") and at_limit.chunks
    assert over.request_id == "big" and over.error.code == k25_pb2.INVALID_ARGUMENT
    assert f"{len(OVER_THE_LIMIT.encode())} bytes" in over.error.message and f"at most {MAX_DOCUMENT_BYTES}" in over.error.message
    assert "--max-document-bytes" in over.error.message
    assert not over.chunks  # nothing half-written


def test_a_frame_beyond_the_frame_limit_is_dropped_and_the_service_keeps_serving(chunker):
    client = dealer(chunker.address)
    client.send(build_request("huge", "x" * (4 * MAX_DOCUMENT_BYTES + (64 << 10))).SerializeToString())
    with pytest.raises(TimeoutError):
        receive(client, timeout_s=1)
    again = ask(client, build_request("again", "第二条 定义。"))
    client.close()
    assert again.request_id == "again" and not again.HasField("error")


def test_metrics_count_requests_documents_passages_and_tokens(chunker):
    before = chunker.metrics()
    client = dealer(chunker.address)
    response = ask(client, build_request("m", contract("zh_data_security_rules.txt"), 256))
    client.close()
    after = chunker.metrics()

    def delta(name: str, labels=()) -> float:
        return after.get((name, labels), 0) - before.get((name, labels), 0)

    assert delta("k25_chunker_requests_total", (("outcome", "ok"),)) == 1
    assert delta("k25_chunker_chunks_total") == len(response.chunks)
    assert delta("k25_chunker_tokens_total") == response.total_tokens
    assert delta("k25_chunker_request_duration_seconds_count") == 1
    assert delta("k25_chunker_document_bytes_sum") == len(contract("zh_data_security_rules.txt").encode())


def test_a_request_past_its_deadline_is_refused_without_being_cut(chunker):
    """What a gateway queued while the chunker was down, and gave up on, costs it nothing."""
    before = chunker.metrics()
    client = dealer(chunker.address)
    late = build_request("late", contract("zh_data_security_rules.txt"), 256)
    late.deadline_unix_s = time.time() - 1
    refused = ask(client, late)
    on_time = build_request("on-time", "第一条 总则", 256)
    on_time.deadline_unix_s = time.time() + 60
    answered = ask(client, on_time)
    client.close()
    after = chunker.metrics()
    assert k25_pb2.ErrorCode.Name(refused.error.code) == "DEADLINE_EXCEEDED" and refused.request_id == "late"
    assert not answered.HasField("error") and answered.chunks
    cut = after.get(("k25_chunker_request_duration_seconds_count", ()), 0) - before.get(
        ("k25_chunker_request_duration_seconds_count", ()), 0)
    assert cut == 1  # only the one on time was cut


# --- the asyncio client -----------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_client_runs_concurrent_requests_and_matches_each_answer(chunker, library):
    names = sorted(p.name for p in CONTRACTS.glob("*.txt"))
    requests = [(contract(name), size) for name in names for size in (64, 256, 512)]
    client = ChunkerClient(chunker.address)
    try:
        answers = await asyncio.gather(
            *(client.chunk(text, size, 0.1, 0.5, traceparent="00-" + "c" * 32 + "-" + "d" * 16 + "-01") for text, size in requests)
        )
    finally:
        client.close()
    for (text, size), answer in zip(requests, answers):
        assert spans(answer.chunks) == spans(library.split(text, ChunkParams(size, 0.1, 0.5)).passages)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "text, kwargs, fragment",
    [
        (OVER_THE_LIMIT, {}, "--max-document-bytes"),
        ("第一条", {"passage_tokens": 4}, "passage_tokens (chunk_size) must be between"),
        ("第一条", {"semantic_threshold": 3.0}, "semantic_threshold must be between"),
    ],
)
async def test_client_raises_the_services_refusals(chunker, text, kwargs, fragment):
    client = ChunkerClient(chunker.address)
    try:
        with pytest.raises(ChunkerError) as info:
            await client.chunk(text, **kwargs)
    finally:
        client.close()
    assert info.value.code == "INVALID_ARGUMENT" and fragment in info.value.message


@pytest.mark.asyncio
async def test_client_times_out_with_deadline_exceeded_when_nobody_answers():
    client = ChunkerClient(f"tcp://127.0.0.1:{free_port()}", timeout_s=0.3)
    started = time.monotonic()
    try:
        with pytest.raises(ChunkerError) as info:
            await client.chunk("第一条 总则")
    finally:
        client.close()
    assert info.value.code == "DEADLINE_EXCEEDED" and 0.3 <= time.monotonic() - started < 5


@pytest.mark.asyncio
async def test_the_clients_request_carries_the_deadline_it_gives_up_at():
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    client = ChunkerClient(f"tcp://127.0.0.1:{port}", timeout_s=30)
    try:
        started = time.time()
        asking = asyncio.create_task(client.chunk("第一条 总则"))
        while not router.poll(0, zmq.POLLIN):
            await asyncio.sleep(0.01)
        sent_before = time.time()
        _, frame = router.recv_multipart()
        request = k25_pb2.ChunkRequest.FromString(frame)
        assert started <= request.deadline_unix_s - 30 <= sent_before  # when it was asked, plus its timeout
        asking.cancel()
    finally:
        client.close()
        router.close(linger=0)
        context.term()


def bytes_unread_at(port: int) -> int:
    """Bytes waiting in the receive queues of the established TCP connections on 127.0.0.1:`port`
    (Linux's /proc/net/tcp: local address, state 01, then tx_queue:rx_queue in hex)."""
    unread = 0
    with open("/proc/net/tcp") as table:
        for row in list(table)[1:]:
            fields = row.split()
            if int(fields[1].split(":")[1], 16) == port and fields[3] == "01":
                unread += int(fields[4].split(":")[1], 16)
    return unread


@pytest.mark.asyncio
async def test_a_request_whose_chunker_went_away_is_asked_again_of_the_one_that_replaced_it(tmp_path, library):
    """As when a chunker pod is replaced: the request reached a chunker that never read it (stopped,
    then killed), and another one came up at the same address."""
    first = start_chunker(tmp_path / "first.log")
    client = ChunkerClient(first.address, timeout_s=60)
    second = None
    try:
        assert not (await client.chunk("第一条 总则。")).HasField("error")  # connected
        first.process.send_signal(signal.SIGSTOP)
        text = contract("zh_equity_transfer.txt")
        asking = asyncio.create_task(client.chunk(text))
        # written to the stopped chunker's connection (its kernel holds it), not kept in the client's queue
        deadline = time.monotonic() + 30
        while not bytes_unread_at(first.zmq_port):
            assert time.monotonic() < deadline, "the request never reached the stopped chunker's socket"
            await asyncio.sleep(0.01)
        first.process.kill()
        first.process.wait(timeout=30)
        second = start_chunker(tmp_path / "second.log", zmq_port=first.zmq_port)
        response = await asking
        assert spans(response.chunks) == spans(library.split(text, DEFAULTS).passages)
    finally:
        client.close()
        for handle in (first, second):
            if handle is not None and handle.process.poll() is None:
                handle.process.terminate()
                handle.process.wait(timeout=30)


@pytest.mark.asyncio
async def test_closing_the_client_cancels_what_waits():
    client = ChunkerClient(f"tcp://127.0.0.1:{free_port()}", timeout_s=30)
    waiting = asyncio.create_task(client.chunk("第一条 总则"))
    await asyncio.sleep(0.1)
    client.close()
    with pytest.raises(ChunkerError) as info:
        await waiting
    assert info.value.code == "CANCELLED"


def test_the_process_serves_healthz_for_its_liveness_probe(chunker):
    status, body = get_json(f"http://127.0.0.1:{chunker.metrics_port}/healthz")
    assert status == 200 and body["healthy"] is True


def test_the_pathological_document_of_the_issue_is_cut(chunker):
    """Dots up to the size limit, then a hard-wrapped lower-case line: quadratic before."""
    text = "." * (MAX_DOCUMENT_BYTES - 3) + "x\ny"
    client = dealer(chunker.address)
    response = ask(client, build_request("dots", text))
    client.close()
    assert not response.HasField("error")
    assert response.chunks[0].start_char == 0 and response.chunks[-1].end_char == len(text)


def test_sigterm_stops_the_service_cleanly(tmp_path):
    handle = start_chunker(tmp_path / "chunker.log")
    client = dealer(handle.address)
    assert not ask(client, build_request("before", "第一条 总则。")).HasField("error")
    client.close()
    handle.process.terminate()
    assert handle.process.wait(timeout=30) == 0
    assert "chunker shutting down" in handle.log() and "Traceback" not in handle.log()
