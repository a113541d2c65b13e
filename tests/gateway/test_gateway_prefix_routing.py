"""Cache-aware routing with real engines: `k25 up` with two engines (tiny-random) and a third
engine started beside them in the same release, all behind `k25 up`'s gateway.

Repeated questions about one document land where its KV is (each reports the document as
cached); a document that an engine computed for someone else is found through that
engine's KV events; an engine that restarts loses its entries at once and is sent nothing
on their account (the gateway's `miss` count stays 0)."""

import re
import signal
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.helpers.engine_process import (
    RELEASE,
    STACK_CURVE_ENV,
    STACK_CURVE_KEY,
    dealer,
    generate_message,
    receive_until_done,
    send,
    start_engine,
    wait_until,
)
from tests.helpers.gateway_process import http_json, start_stack
from tests.helpers.up_stack import announced
from tests.helpers.redis_server import module_redis_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

BLOCK = 16  # the engines' default block_size
CHUNK = 256  # k25 up's default chunk_size


@pytest.fixture(scope="module")
def stack(tmp_path_factory, module_redis_url):  # noqa: F811
    folder = tmp_path_factory.mktemp("prefix-routing")
    service = start_stack(str(folder / "up.log"), "--model", "tiny-random", "--engines", "2",
                          "--redis-url", module_redis_url, "--release", RELEASE, "--log-dir", str(folder),
                          env=STACK_CURVE_ENV)  # the third engine below joins it with the same key
    yield service
    service.stop(signal.SIGINT)


def document(seed: int, length: int = 300) -> list[int]:
    return [(seed * 7919 + i * 104729) % 40000 + 100 for i in range(length)]


def ask(stack, prompt_ids: list[int]) -> dict:
    status, _, body = http_json(f"{stack.url}/v1/completions",
                                {"model": "tiny-random", "prompt": prompt_ids, "max_tokens": 4, "temperature": 0})
    assert status == 200, body
    return body


def cached(body: dict) -> int:
    return body["usage"]["prompt_tokens_details"]["cached_tokens"]


def gateway_metrics(stack) -> str:
    with urllib.request.urlopen(f"{stack.url}/metrics", timeout=10) as response:
        return response.read().decode()


def routing_counts(stack) -> dict[str, float]:
    found = re.finditer(r'^k25_gateway_prefix_routing_total\{result="(\w+)"\} (\S+)$', gateway_metrics(stack), re.M)
    return {m[1]: float(m[2]) for m in found}


def index_blocks(stack) -> int:
    return int(float(re.search(r"^k25_gateway_prefix_index_blocks (\S+)$", gateway_metrics(stack), re.M)[1]))


def test_an_engine_that_restarts_loses_its_entries(stack, module_redis_url, tmp_path):  # noqa: F811
    """First in the module: the stack has served nothing yet, so every block the gateway's
    index holds comes from the third engine."""
    doc = document(2)
    doc_blocks = len(doc) // BLOCK
    assert index_blocks(stack) == 0
    outside = start_engine(module_redis_url, str(tmp_path / "e-out.log"), "--model", "tiny-random", engine_id="e-out",
                           env=STACK_CURVE_ENV)
    try:
        # the document computed on a third engine for a caller that is not the gateway: the
        # gateway hears of it only through that engine's KV events
        socket = dealer(outside.address, STACK_CURVE_KEY)
        message = generate_message(doc + [1, 2, 3], CHUNK, max_tokens=2, ignore_eos=True)
        message.generate.cache_salt = "default"  # the gateway's salt for callers without an API key
        send(socket, message)
        receive_until_done(socket, message.generate.request_id)
        socket.close(0)
        wait_until(lambda: index_blocks(stack) >= doc_blocks, what="the gateway heard the engine's KV events")
        assert cached(ask(stack, doc + [50, 51])) == doc_blocks * BLOCK

        misses = routing_counts(stack).get("miss", 0)
        outside.stop()
        # the gateway drops an engine's entries in the same turn as it reads the registry without it
        wait_until(lambda: http_json(f"{stack.url}/readyz")[2]["engines"] == 2, what="the gateway saw the engine leave")
        outside = start_engine(module_redis_url, str(tmp_path / "e-out-2.log"), "--model", "tiny-random",
                               engine_id="e-out", env=STACK_CURVE_ENV)
        for question in range(3):  # whichever engines they go to, none holds the document now
            assert cached(ask(stack, doc + [60 + question, 61])) in (0, doc_blocks * BLOCK)
        assert routing_counts(stack).get("miss", 0) == misses, "a request went to the restarted engine for blocks it lost"
    finally:
        outside.stop()


def test_questions_about_one_document_land_where_its_kv_is(stack):
    doc = document(1)
    first = ask(stack, doc + [11, 12, 13])
    assert cached(first) == 0
    for question in range(5):
        body = ask(stack, doc + [20 + question, 30, 40])
        # with two idle engines taking turns, load-only routing would send half of them to the engine without it
        assert cached(body) == len(doc) // BLOCK * BLOCK, f"question {question} missed the document's KV"
    assert routing_counts(stack).get("miss", 0) == 0


def test_questions_sent_together_follow_the_first_before_it_has_answered(stack):
    """The gateway records where it sends a prompt before sending it, not at its first token:
    questions about one document that arrive together go where the first went (where the
    document will be cached), not half of them to the other engine by load."""
    doc = document(3, length=1000)  # ~4 chunks held: worth more than three more requests and their queued prefill
    before = finished_per_engine(stack)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda question: ask(stack, doc + [70 + question, 71]), range(4)))
    after = finished_per_engine(stack)
    served = sorted(after[e] - before.get(e, 0) for e in after)
    assert served[-1] == 4 and sum(served) == 4, f"the questions were split between engines: {served}"


def finished_per_engine(stack) -> dict[str, float]:
    """Requests each of `k25 up`'s engines finished, from its own metrics."""
    counts = {}
    for engine in ("engine-default-0", "engine-default-1"):
        url = announced(stack, engine)[-1]["metrics"]
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        counts[engine] = sum(float(v) for v in re.findall(r"^k25_engine_requests_finished_total\{[^}]*\} (\S+)$", text, re.M))
    return counts
