"""One trace per request across real processes: gateway -> chunker -> engines, exported over
OTLP/HTTP to a receiver inside this test, with the parent links and attributes of DESIGN."""

import signal
import time

import httpx
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.helpers.engine_process import wait_until
from tests.helpers.gateway_process import start_stack
from tests.helpers.otlp_receiver import OtlpReceiver
from tests.helpers.paths import CONTRACTS

pytestmark = pytest.mark.slow

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def receiver():
    otlp = OtlpReceiver()
    yield otlp
    otlp.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory, receiver):
    folder = tmp_path_factory.mktemp("tracing")
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    service = start_stack(str(folder / "up.log"), "--model", "tiny-random", "--log-dir", str(folder), env=env)
    yield service
    service.stop(signal.SIGINT)


def test_a_document_question_is_one_trace_across_every_process(stack, receiver):
    body = {"model": "tiny-random", "document": (CONTRACTS / "en_master_services_agreement.txt").read_text()[:2500], "question": "Who may terminate?",
            "chunk_size": 256, "max_tokens": 6, "note_max_tokens": 4, "read": "notes"}
    headers = {"traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01"}
    answer = httpx.post(f"{stack.url}/v1/documents/ask", json=body, headers=headers, timeout=120).json()
    chunks = answer["chunks"]
    engine_requests = len(answer["passages_read"]) + 1  # one note per passage read, then the answer

    def complete():
        spans = receiver.in_trace(TRACE_ID)
        return spans if sum(s.name == "k25.engine.request" for s in spans) >= engine_requests else None

    spans = wait_until(complete, timeout_s=30, what="every engine request span")
    time.sleep(0.5)  # late exports of the same trace
    spans = receiver.in_trace(TRACE_ID)
    by_id = {s.span_id: s for s in spans}
    assert {s.service for s in spans} == {"k25-gateway", "k25-chunker", "k25-engine"}

    [root] = [s for s in spans if s.name == "POST /v1/documents/ask"]
    assert root.parent_span_id == CALLER_SPAN and root.kind == Span.SPAN_KIND_SERVER
    [ask] = [s for s in spans if s.name == "k25.documents.ask"]
    assert ask.parent_span_id == root.span_id and ask.attributes["k25.chunks"] == chunks

    [chunker_server] = [s for s in spans if s.service == "k25-chunker"]
    chunker_client = by_id[chunker_server.parent_span_id]
    assert chunker_client.service == "k25-gateway" and chunker_client.parent_span_id == ask.span_id
    assert chunker_server.attributes["k25.chunks"] == chunks

    calls = [s for s in spans if s.name == "chat tiny-random"]
    assert len(calls) == engine_requests and all(c.parent_span_id == ask.span_id for c in calls)
    for call in calls:
        assert call.kind == Span.SPAN_KIND_CLIENT
        assert call.attributes["gen_ai.operation.name"] == "chat"
        assert call.attributes["gen_ai.request.model"] == "tiny-random"
        assert call.attributes["gen_ai.usage.output_tokens"] > 0
        assert call.attributes["k25.pool"] == "default" and call.attributes["k25.chunk_size"] == 256

    requests = [s for s in spans if s.name == "k25.engine.request"]
    assert {by_id[r.parent_span_id].name for r in requests} == {"chat tiny-random"}
    assert len({r.parent_span_id for r in requests}) == engine_requests
    for request in requests:
        children = [s for s in spans if s.parent_span_id == request.span_id]
        names = [c.name for c in children]
        assert names.count("k25.engine.queue") == 1 and names.count("k25.engine.decode") == 1
        prefills = [c for c in children if c.name == "k25.engine.prefill_chunk"]
        assert len(prefills) == request.attributes["k25.prefill_chunks"] >= 1
        # the prompt's tokens are computed in its prefill slices, but for those found in the prefix cache
        cached = request.attributes["k25.prefix_cache.cached_tokens"]
        assert sum(p.attributes["k25.tokens"] for p in prefills) == request.attributes["gen_ai.usage.input_tokens"] - cached
        assert sum(request.attributes[f"k25.kv_tier.{tier}_tokens"] for tier in ("device", "host", "disk")) == cached
        assert request.attributes["k25.engine"] and request.attributes["k25.pool"] == "default"
        assert all(request.start_ns <= c.start_ns <= c.end_ns <= request.end_ns for c in children)
