"""Long-document questions: the pure map/reduce/citation functions, the request fields, the
bounded fan-out of the notes, then /v1/chunks and /v1/documents/ask through a `k25 up` stack
(tiny model, real chunker), and a failed note stopping its siblings' engine requests."""

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
import urllib.request

import httpx
import pytest
from fastapi import FastAPI
from opentelemetry import trace
from prometheus_client.parser import text_string_to_metric_families

from common.redis_keys import live_engines
from common.tokenizer import load_tokenizer
from services.gateway.admission import Ticket
from services.gateway.api_keys import ANONYMOUS
from services.gateway.document_routes import AskRequest, ChunksRequest, _ask, _job, install_document_routes
from services.gateway.documents import (
    NOTE_MARK_TOKENS,
    NOTHING,
    PROMPT_TOKENS,
    Passage,
    citations,
    map_messages,
    note_line,
    notes_that_fit,
    question_cost,
    reduce_messages,
    take_notes,
    too_many_passages,
)
from services.gateway.errors import OpenAIError, invalid_request
from services.gateway.openai_schema import ChatCompletionRequest
from services.gateway.service import Gateway, ReplyShape
from services.gateway.settings import GatewaySettings
from tests.helpers.engine_process import STACK_CURVE_ENV, STACK_CURVE_KEY, wait_until
from tests.helpers.gateway_process import start_stack
from tests.helpers.paths import CONTRACTS
from tests.helpers.up_stack import UP_RELEASE, announced, redis_client

CONTRACT = CONTRACTS / "en_master_services_agreement.txt"


def passage(index, note="", anchor="Section 1"):
    return Passage(index, anchor, index * 100, index * 100 + 90, f"text of part {index}", note)


def test_map_prompt_carries_the_question_the_passage_and_its_anchor():
    [system, user] = map_messages("Who may terminate?", passage(3, anchor="Article 9"))
    assert "Who may terminate?" in user["content"] and "text of part 3" in user["content"]
    assert "Article 9" in user["content"] and NOTHING in user["content"]


def test_reduce_prompt_keeps_only_notes_that_bear_on_the_question():
    passages = [passage(1, "Either party may terminate on 30 days' notice."), passage(2, "NOTHING"), passage(3, "  "),
                passage(4, "Nothing. (NOTHING)".upper())]
    user = reduce_messages("Who may terminate?", passages)[1]["content"]
    assert "[1] (Section 1) Either party may terminate" in user
    assert "[2]" not in user and "[3]" not in user and "[4]" not in user


@pytest.mark.parametrize("tokens, room, kept, left_out", [
    ([10, 10, 10], 33, [3, 1, 2], 0),  # each line costs its tokens and a line break
    ([10, 10, 10], 32, [3, 1], 1),
    ([10, 30, 5], 20, [3], 2),  # the best that fit, not a smaller note further down the ranking
    ([10, 10, 10], 5, [], 3),
    ([10, 10, 10], -50, [], 3),  # max_tokens alone over the context
])
def test_the_answer_holds_the_best_ranked_notes_that_fit_in_document_order(tokens, room, kept, left_out):
    ranked = [passage(3, "c"), passage(1, "a"), passage(2, "b")]  # best first
    fitted, left = notes_that_fit(ranked, tokens, room)
    assert [p.index for p in fitted] == sorted(kept) and left == left_out


def test_notes_that_bear_on_nothing_cost_no_room_and_are_not_counted_as_left_out():
    ranked = [passage(1, NOTHING), passage(2, "b"), passage(3, "  "), passage(4, "d")]
    assert notes_that_fit(ranked, [0, 10, 0, 10], room=11) == ([ranked[1]], 1)
    assert note_line(passage(2, " b ", anchor="")) == "[2] (part 2) b"


def test_citations_are_the_cited_passages_in_order_of_citation():
    passages = [passage(1, "a"), passage(2, "b"), passage(3, NOTHING)]
    assert [c["index"] for c in citations("See [2], and also [1] and [2] again; [9] does not exist.", passages)] == [2, 1]
    assert citations("[2]", passages)[0] == {"index": 2, "anchor": "Section 1", "start_char": 200, "end_char": 290}


def test_without_citations_every_relevant_passage_is_cited():
    passages = [passage(1, "a"), passage(2, NOTHING), passage(3, "c")]
    assert [c["index"] for c in citations("An answer citing nothing.", passages)] == [1, 3]


def test_notes_are_taken_concurrently_and_kept_in_order():
    started = []

    async def note(messages):
        started.append(messages[1]["content"])
        await asyncio.sleep(0.05 if "part 1" in messages[1]["content"] else 0.0)
        return re.search(r"text of part (\d)", messages[1]["content"]).group(0)

    passages = asyncio.run(take_notes("q", [passage(1), passage(2), passage(3)], note, concurrency=8))
    assert [p.note for p in passages] == ["text of part 1", "text of part 2", "text of part 3"]
    assert len(started) == 3


def test_at_most_the_fanout_of_notes_run_at_once():
    running, most = 0, 0

    async def note(messages):
        nonlocal running, most
        running += 1
        most = max(most, running)
        for _ in range(5):  # a few turns of the loop, in which the others could start
            await asyncio.sleep(0)
        running -= 1
        return "n"

    passages = asyncio.run(take_notes("q", [passage(i) for i in range(1, 11)], note, concurrency=3))
    assert most == 3 and [p.note for p in passages] == ["n"] * 10


def test_the_first_failed_note_cancels_the_others_before_the_error_is_raised():
    started, cancelled = set(), set()

    async def note(messages):
        index = int(re.search(r"Part (\d+)", messages[1]["content"]).group(1))
        started.add(index)
        if index == 2:
            await asyncio.sleep(0)  # the others are running by now
            raise ValueError("note 2 failed")
        try:
            await asyncio.Event().wait()  # an engine request that would never end
        except asyncio.CancelledError:
            cancelled.add(index)
            raise

    async def ask():
        with pytest.raises(ValueError, match="note 2 failed"):
            await take_notes("q", [passage(i) for i in range(1, 11)], note, concurrency=4)
        return set(started), set(cancelled)  # as they stood when the error reached the caller

    started_then, cancelled_then = asyncio.run(ask())
    assert {1, 3, 4} <= cancelled_then == started_then - {2}  # every note that ran alongside it was stopped
    assert len(started_then) < 10  # and the rest never started


@pytest.mark.parametrize("model", [ChunksRequest, AskRequest])
def test_passage_tokens_is_the_request_field_and_chunk_size_its_old_name(model):
    others = {"text": "x"} if model is ChunksRequest else {"model": "m", "document": "x", "question": "q"}
    assert model.model_validate({**others, "chunk_size": 64}).passage_tokens == 64
    assert model.model_validate({**others, "passage_tokens": 96}).passage_tokens == 96
    assert model.model_validate(others).passage_tokens is None
    with pytest.raises(ValueError, match="chunk_size"):
        model.model_validate({**others, "chunk_size": 4})


def test_openapi_says_the_field_is_a_passage_budget_not_the_pool_s_chunk_size():
    app = FastAPI()
    install_document_routes(app, gateway=None, caller=lambda: None)
    schemas = app.openapi()["components"]["schemas"]
    for name in ("ChunksRequest", "AskRequest"):
        field = schemas[name]["properties"]["passage_tokens"]
        assert "passage's token budget" in field["description"] and "chunk_size" in field["description"]
        assert "chunk_size" not in schemas[name]["properties"]
    assert "passage" in schemas["AskRequest"]["properties"]["note_max_tokens"]["description"]


def test_a_question_within_the_passage_bound_is_read():
    assert too_many_passages(256, 256) is None


def test_a_question_asking_for_more_passages_than_the_bound_is_refused_naming_it():
    error = too_many_passages(257, 256)
    assert error.status == 400 and error.code == "too_many_passages" and error.param == "passages"
    assert "at most 256" in error.message and "--max-document-passages" in error.message and "257" in error.message


def test_a_note_asked_for_after_the_request_s_deadline_is_not_sent():
    body = AskRequest(model="tiny-random", document="x", question="q")
    with pytest.raises(OpenAIError) as late:
        asyncio.run(_job(None, body, [], 4, ANONYMOUS, None, deadline=time.time() - 1))
    assert late.value.status == 504 and late.value.code == "timeout"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    folder = tmp_path_factory.mktemp("documents")
    service = start_stack(str(folder / "up.log"), "--model", "tiny-random", "--log-dir", str(folder),
                          env=STACK_CURVE_ENV)  # so that a gateway in this process can reach its engine
    yield service
    service.stop(signal.SIGINT)


def gateway_requests(stack) -> float:
    text = httpx.get(f"{stack.url}/metrics").text
    return sum(float(v) for v in re.findall(r'^k25_gateway_requests_total\{pool="default",status="200"\} (\S+)$', text, re.M))


@pytest.mark.slow
def test_passages_through_the_gateway_are_the_offline_chunker_s(stack):
    text = CONTRACT.read_text()
    answer = httpx.post(f"{stack.url}/v1/chunks", json={"text": text, "chunk_size": 256}, timeout=60).json()
    by_new_name = httpx.post(f"{stack.url}/v1/chunks", json={"text": text, "passage_tokens": 256}, timeout=60).json()
    offline = subprocess.run([sys.executable, "-m", "k25.cli", "chunk", str(CONTRACT), "--chunk-size", "256"],
                             capture_output=True, text=True, check=True)
    expected = json.loads(offline.stdout)["chunks"]
    assert [{k: p[k] for k in expected[0]} for p in answer["data"]] == expected
    assert [p["index"] for p in answer["data"]] == list(range(len(expected)))
    assert by_new_name == answer


@pytest.mark.slow
def test_ask_maps_every_passage_then_reduces_and_cites_real_spans(stack):
    text = CONTRACT.read_text()[:4000]
    passages = httpx.post(f"{stack.url}/v1/chunks", json={"text": text, "chunk_size": 256}, timeout=60).json()["data"]
    before = gateway_requests(stack)
    body = {"model": "tiny-random", "document": text, "question": "Who may terminate the agreement?",
            "chunk_size": 256, "max_tokens": 12, "note_max_tokens": 6, "passages": len(passages), "read": "notes"}
    answer = httpx.post(f"{stack.url}/v1/documents/ask", json=body, timeout=120).json()
    assert answer["object"] == "document.answer" and answer["chunks"] == len(passages) > 1
    assert sorted(p["index"] for p in answer["passages_read"]) == list(range(1, len(passages) + 1))
    assert answer["answer"] and answer["usage"]["completion_tokens"] > 0
    spans = {(p["start_char"], p["end_char"], p["anchor"]) for p in passages}
    assert answer["citations"] and all((c["start_char"], c["end_char"], c["anchor"]) in spans for c in answer["citations"])
    assert gateway_requests(stack) - before == len(passages) + 1  # one note per passage, then the answer


@pytest.mark.slow
def test_ask_streams_the_passages_read_its_progress_then_the_answer_then_the_citations(stack):
    body = {"model": "tiny-random", "document": CONTRACT.read_text()[:2000], "question": "What are the fees?",
            "passage_tokens": 256, "max_tokens": 8, "note_max_tokens": 4, "stream": True, "passages": 2,
            "read": "notes"}
    with httpx.stream("POST", f"{stack.url}/v1/documents/ask", json=body, timeout=120) as response:
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    payloads = [json.loads(e) for e in events[:-1]]
    chosen, progress, answer = payloads[0], payloads[1:3], payloads[3:-1]
    assert chosen["object"] == "document.passages" and len(chosen["passages_read"]) == 2
    assert [p["object"] for p in progress] == ["document.progress"] * 2 and [p["read"] for p in progress] == [1, 2]
    assert {p["passage"]["index"] for p in progress} == {p["index"] for p in chosen["passages_read"]}
    assert all(p["object"] == "chat.completion.chunk" for p in answer)
    assert "".join(p["choices"][0]["delta"].get("content", "") for p in answer)
    assert payloads[-1]["object"] == "document.citations" and payloads[-1]["citations"]
    assert payloads[-1]["passages_read"] == chosen["passages_read"] and payloads[-1]["notes_left_out"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("body, status, code", [
    ({"model": "tiny-random", "document": "", "question": "q"}, 400, None),
    ({"model": "tiny-random", "document": "x", "question": "q", "chunk_size": 4}, 400, None),
    ({"model": "tiny-random", "document": "x", "question": "q", "passage_tokens": 4}, 400, None),
    ({"model": "nope", "document": "x", "question": "q"}, 404, "model_not_found"),
])
def test_ask_errors(stack, body, status, code):
    response = httpx.post(f"{stack.url}/v1/documents/ask", json=body, timeout=60)
    assert response.status_code == status
    assert code is None or response.json()["error"]["code"] == code


@pytest.mark.slow
def test_a_question_asking_for_too_many_passages_is_refused_before_any_work(stack):
    before = gateway_requests(stack)
    body = {"model": "tiny-random", "document": "x", "question": "q", "passages": 257, "max_tokens": 4}
    response = httpx.post(f"{stack.url}/v1/documents/ask", json=body, timeout=60)
    assert response.status_code == 400 and response.json()["error"]["code"] == "too_many_passages"
    assert gateway_requests(stack) == before


FEES = AskRequest(model="tiny-random", document=CONTRACT.read_text()[:2000], question="What are the fees?",
                  passage_tokens=256, max_tokens=4, note_max_tokens=2, read="notes")


def ask_in_process(stack, body: AskRequest, tokens_per_minute: int | None = None):
    """`_ask` on a gateway in this process that shares the stack's registry and chunker, its
    admission reserving as the route does. Returns (when it started, the deadline of each engine
    job it ran, the error it ended with or None)."""
    chunker = re.search(r"k25 up: chunker\s+tcp://(\S+),", stack.log()).group(1)

    async def ask():
        settings = GatewaySettings(model="tiny-random", release=UP_RELEASE, curve_secret_key=STACK_CURVE_KEY.encode(),
                                   chunker_address=chunker, request_timeout_s=300)
        gateway = Gateway(settings, load_tokenizer("tiny-random"), redis_client(stack))
        await gateway.start()
        deadlines, generate = [], gateway.generate

        async def recorded(job, shape, span):
            deadlines.append(job.deadline)
            return await generate(job, shape, span)

        gateway.generate = recorded
        started, error = time.time(), None
        ticket = Ticket(gateway.admission, "t", tokens_per_minute)
        try:
            ticket.reserve(body.reserved_tokens())
            await _ask(gateway, body, trace.INVALID_SPAN, ANONYMOUS, ticket)
        except OpenAIError as refused:
            error = refused
        finally:
            await gateway.stop()
        return started, deadlines, error

    return asyncio.run(ask())


@pytest.mark.slow
def test_every_note_and_the_answer_share_the_request_s_one_deadline(stack):
    """Not a fresh request timeout per passage: the notes and the answer run against one deadline."""
    started, deadlines, error = ask_in_process(stack, FEES)
    assert error is None
    assert len(deadlines) > 2 and len(set(deadlines)) == 1  # every note, then the answer
    assert started <= deadlines[0] - 300 <= time.time()


@pytest.mark.slow
def test_a_tenant_whose_rate_cannot_pay_for_the_whole_question_gets_429_before_any_note(stack):
    """Its admission's first estimate passes; the question's whole cost, known once the document
    is cut (small passages: many notes), is more than its rate can ever pay: refused before any
    engine job, not charged after its notes ran."""
    body = FEES.model_copy(update={"passage_tokens": 16, "passages": 256})
    _, deadlines, error = ask_in_process(stack, body, tokens_per_minute=2 * body.reserved_tokens())
    assert error is not None and error.status == 429 and error.code == "rate_limit_exceeded"
    assert "at most" in error.message and error.headers == {"x-should-retry": "false"}  # it never fits: no retry
    assert deadlines == []


@pytest.mark.slow
def test_notes_past_the_context_are_left_out_by_rank_and_counted(stack):
    """Eight notes of a quarter of the context each are twice what the final prompt can hold: the
    answer holds the best-ranked notes that fit and says how many were left out (before, the
    final prompt was longer than the context: 400 context_length_exceeded after every note ran)."""
    context = max(entry["max_model_len"] for entry in live_engines(redis_client(stack), UP_RELEASE).values())
    body = {"model": "tiny-random", "document": CONTRACT.read_text()[:3000], "question": "What are the fees?",
            "passage_tokens": 16, "passages": 8, "note_max_tokens": context // 4, "max_tokens": 4, "read": "notes"}
    response = httpx.post(f"{stack.url}/v1/documents/ask", json=body, timeout=300)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["notes_left_out"] >= 1
    read = [p["index"] for p in answer["passages_read"]]
    assert {c["index"] for c in answer["citations"]} <= set(read)


def test_a_question_costs_every_note_then_an_answer_holding_every_note():
    assert question_cost([100, 100], question_tokens=10, note_max_tokens=8, max_tokens=20) == (
        2 * (100 + 10 + PROMPT_TOKENS + 8) + 2 * (8 + NOTE_MARK_TOKENS) + 10 + PROMPT_TOKENS + 20)
    assert question_cost([], 10, 8, 20) == 10 + PROMPT_TOKENS + 20


def engine_sample(metrics_url: str, name: str, **labels) -> float:
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and labels.items() <= sample.labels.items())


@pytest.mark.slow
def test_a_failed_note_stops_the_engine_requests_of_the_others(stack):
    """Three notes stream from the stack's engine, each asked for thousands of tokens, when the
    fourth fails: the engine ends all three as aborted. The gateway runs in this process and
    shares the stack's registry; the failing note waits until the others' first tokens arrived."""
    metrics = announced(stack, "engine-default-0")[-1]["metrics"]

    def finished(reason: str) -> float:
        return engine_sample(metrics, "k25_engine_requests_finished_total", finish_reason=reason)

    wait_until(lambda: engine_sample(metrics, "k25_engine_running_requests") == 0, 60, what="the engine idle")
    aborted, lengthy = finished("abort"), finished("length")

    async def ask():
        settings = GatewaySettings(model="tiny-random", release=UP_RELEASE, curve_secret_key=STACK_CURVE_KEY.encode())
        gateway = Gateway(settings, load_tokenizer("tiny-random"), redis_client(stack))
        await gateway.start()
        context = max(e.max_model_len for e in gateway.registry.engines)

        def first_tokens() -> float:
            return sum(s.value for m in gateway.metrics.ttft.collect() for s in m.samples if s.name.endswith("_count"))

        async def note(messages):
            if "Part 4 " in messages[1]["content"]:
                while first_tokens() < 3:
                    await asyncio.sleep(0.005)
                raise invalid_request("note 4 failed")
            prompt_ids = await gateway.encoder.encode_chat(messages)
            max_tokens = min(gateway.settings.max_tokens_limit, context - len(prompt_ids))
            request = ChatCompletionRequest(model="tiny-random", messages=messages, temperature=0, max_tokens=max_tokens)
            job = gateway.make_job(request, prompt_ids, ANONYMOUS, "doc")
            job.sampling.ignore_eos = True  # all its tokens: far longer than the test waits
            return (await gateway.generate(job, ReplyShape(True), trace.INVALID_SPAN)).text

        try:
            with pytest.raises(OpenAIError, match="note 4 failed"):
                await take_notes("Who may terminate?", [passage(i) for i in range(1, 5)], note, concurrency=4)
        finally:
            await gateway.stop()

    asyncio.run(ask())
    wait_until(lambda: finished("abort") == aborted + 3, 60, what="three requests aborted on the engine")
    assert engine_sample(metrics, "k25_engine_running_requests") == 0 and finished("length") == lengthy
