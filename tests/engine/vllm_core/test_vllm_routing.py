"""Cache-aware routing over vLLM-backed engines: `k25 up --backend vllm --engines 2` serving SmolLM2
(vLLM's CPU attention takes no head of 16, the tiny random model's), and a third vLLM engine
beside them. The vLLM backend announces its prefix cache in K25's block hashes
(engine/vllm_core/kv_events.py): a document it computed for a caller that is not the gateway
reaches the gateway's index, and questions about it go there."""

import re
import signal
import urllib.request

import pytest

from engine.vllm_core.settings import BLOCK_SIZE
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
from tests.helpers.gateway_process import BACKEND_FLAGS, http_json, start_stack
from tests.helpers.paths import VLLM_PYTHON
from tests.helpers.redis_server import module_redis_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
CHUNK = 256  # k25 up's default chunk_size


@pytest.fixture(scope="module")
def stack(tmp_path_factory, module_redis_url):  # noqa: F811
    folder = tmp_path_factory.mktemp("vllm-routing")
    service = start_stack(str(folder / "up.log"), "--model", MODEL, "--engines", "2", "--log-dir", str(folder),
                          "--redis-url", module_redis_url, "--release", RELEASE, *BACKEND_FLAGS["vllm"],
                          env=STACK_CURVE_ENV)  # the third engine below joins it with the same key
    yield service
    service.stop(signal.SIGINT)


def document(seed: int, length: int = 300) -> list[int]:
    return [(seed * 7919 + i * 104729) % 40000 + 100 for i in range(length)]


def ask(stack, prompt_ids: list[int]) -> int:
    """The answer's cached prompt tokens."""
    status, _, body = http_json(f"{stack.url}/v1/completions",
                                {"model": MODEL, "prompt": prompt_ids, "max_tokens": 4, "temperature": 0})
    assert status == 200, body
    return body["usage"]["prompt_tokens_details"]["cached_tokens"]


def gateway_metric(stack, pattern: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{stack.url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {m[1]: float(m[2]) for m in re.finditer(pattern, text, re.MULTILINE)}


def index_blocks(stack) -> float:
    return gateway_metric(stack, r"^(k25_gateway_prefix_index_blocks) (\S+)$")["k25_gateway_prefix_index_blocks"]


def test_a_document_computed_for_another_caller_is_found_through_kv_events(stack, module_redis_url, tmp_path):  # noqa: F811
    """First in the module: the gateway's index is empty, so what it learns comes from the third engine."""
    doc = document(2)
    assert index_blocks(stack) == 0
    outside = start_engine(module_redis_url, str(tmp_path / "e-out.log"), "--model", MODEL, "--backend", "vllm",
                           "--enforce-eager", engine_id="e-out", env=STACK_CURVE_ENV, python=VLLM_PYTHON, timeout_s=300)
    try:
        socket = dealer(outside.address, STACK_CURVE_KEY)
        message = generate_message(doc + [1, 2, 3], CHUNK, max_tokens=2, ignore_eos=True)
        message.generate.cache_salt = "default"  # the gateway's salt for callers without an API key
        send(socket, message)
        receive_until_done(socket, message.generate.request_id, timeout_s=120)
        socket.close(0)
        wait_until(lambda: index_blocks(stack) >= len(doc) // BLOCK_SIZE, what="the gateway heard the engine's KV events")
        # three engines take turns under load-only routing: two in three would miss
        assert ask(stack, doc + [50, 51]) == len(doc) // BLOCK_SIZE * BLOCK_SIZE
    finally:
        outside.stop()


def test_questions_about_one_document_land_where_its_kv_is(stack):
    doc = document(1)
    assert ask(stack, doc + [11, 12, 13]) == 0
    for question in range(5):
        assert ask(stack, doc + [20 + question, 30, 40]) == len(doc) // BLOCK_SIZE * BLOCK_SIZE, question
    routing = gateway_metric(stack, r'^k25_gateway_prefix_routing_total\{result="(\w+)"\} (\S+)$')
    assert routing.get("miss", 0) == 0, routing
