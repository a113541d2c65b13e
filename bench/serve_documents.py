"""The stored-document workload of `k25 bench serve` (`--stored-documents FILE ...`): each file is
uploaded once (`POST /v1/documents`, warmed with `--warm`), then `--questions` questions about
each are asked by id (`POST /v1/documents/ask`) as Poisson arrivals at `--qps`, in rounds that
ask about every document once in a fresh random order, so that the questions about one document
interleave with the others'. Each question's latency, the passages it read and the prompt tokens
the engines found cached are reported, a document's first question apart from the later ones.
The documents are deleted after the run.

The questions come from `--questions-file` (the format of tests/fixtures/contracts/questions.json:
file name -> [{"question": ...}, ...]) for the files it names, else from a contract review's
usual questions. The schedule and the statistics are plain functions."""

import asyncio
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
from tqdm import tqdm

from bench.serve_basics import CannotBenchmark, error_message_of, poisson_times
from bench.serve_stats import latency_ms

REVIEW_QUESTIONS = [
    "Who are the parties to the agreement?",
    "Which law governs the agreement?",
    "How can either party terminate the agreement?",
    "When must invoices be paid?",
    "Is either party's liability limited?",
    "What happens to the data when the agreement ends?",
    "How must notices be given?",
    "May the agreement be assigned?",
]


@dataclass(frozen=True)
class AskSpec:
    send_at_s: float
    document: int  # index of the document asked about
    question: str
    nth: int  # 0: the document's first question
    max_tokens: int


@dataclass
class AskResult:
    spec: AskSpec
    started_s: float
    ended_s: float = 0.0
    passages_read: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None
    error_message: str = ""


def questions_for(names: list[str], asked: dict[str, list[dict]] | None) -> list[list[str]]:
    """The questions of each document: those the questions file gives for its name, else the review's."""
    return [[q["question"] for q in (asked or {}).get(name, [])] or REVIEW_QUESTIONS for name in names]


def make_ask_workload(send_at_s, questions: list[list[str]], per_document: int, max_tokens: tuple[int, int],
                      rng: np.random.Generator) -> list[AskSpec]:
    """`per_document` questions about each document, in rounds (each a fresh random order of the
    documents); a document's n-th question is the n-th of its list (round the list again past
    its end). `send_at_s` needs as many times as questions."""
    count = len(questions) * per_document
    if len(send_at_s) != count:
        raise ValueError(f"{len(questions)} x {per_document} questions need as many send times, got {len(send_at_s)}")
    order = [(nth, int(d)) for nth in range(per_document) for d in rng.permutation(len(questions))]
    return [AskSpec(float(at), d, questions[d][nth % len(questions[d])], nth,
                    int(rng.integers(max_tokens[0], max_tokens[1] + 1))) for at, (nth, d) in zip(send_at_s, order)]


def summarize_asks(results: list[AskResult], wall_s: float) -> dict:
    ok = [r for r in results if r.error is None]
    first, later = [r for r in ok if r.spec.nth == 0], [r for r in ok if r.spec.nth > 0]
    errors: dict[str, int] = {}
    examples: dict[str, str] = {}
    for r in results:
        if r.error is not None:
            errors[r.error] = errors.get(r.error, 0) + 1
            examples.setdefault(r.error, r.error_message)
    first_ms, later_ms = latency_ms([r.ended_s - r.started_s for r in first]), latency_ms([r.ended_s - r.started_s for r in later])
    prompt = sum(r.prompt_tokens for r in ok)
    return {
        "requests": len(results), "completed": len(ok), "failed": len(results) - len(ok),
        "errors": dict(sorted(errors.items())), "error_examples": dict(sorted(examples.items())), "wall_s": wall_s,
        "latency_ms": latency_ms([r.ended_s - r.started_s for r in ok]), "first_question_ms": first_ms,
        "later_questions_ms": later_ms,
        "later_to_first_p50": later_ms["p50"] / first_ms["p50"] if first_ms["p50"] and later_ms["p50"] else None,
        "passages_read": {"mean": sum(r.passages_read for r in ok) / len(ok) if ok else None,
                          "min": min((r.passages_read for r in ok), default=None),
                          "max": max((r.passages_read for r in ok), default=None)},
        "cached_share": sum(r.cached_tokens for r in ok) / prompt if prompt else None,
        "questions_with_cache_hits": sum(r.cached_tokens > 0 for r in ok),
    }


async def upload(client: httpx.AsyncClient, url: str, texts: list[str], warm: bool) -> list[str]:
    """Store each document once; their ids."""
    ids = []
    for i, text in enumerate(texts):
        response = await client.post(f"{url}/v1/documents", json={"text": text, "warm": warm})
        if response.status_code != 200:
            await delete(client, url, ids)
            raise CannotBenchmark(f"uploading document {i + 1} answered HTTP {response.status_code}: "
                                  f"{error_message_of(response.content)}")
        ids.append(response.json()["id"])
    return ids


async def delete(client: httpx.AsyncClient, url: str, ids: list[str]) -> None:
    for document_id in ids:
        await client.delete(f"{url}/v1/documents/{document_id}")


async def ask(client: httpx.AsyncClient, url: str, model: str, document_id: str, spec: AskSpec, passages: int | None,
              read: str | None, clock) -> AskResult:
    body = {"model": model, "document_id": document_id, "question": spec.question, "max_tokens": spec.max_tokens,
            "note_max_tokens": spec.max_tokens} | ({"passages": passages} if passages else {}) | \
        ({"read": read} if read else {})
    result = AskResult(spec, clock())
    try:
        response = await client.post(f"{url}/v1/documents/ask", json=body)
        if response.status_code != 200:
            result.error, result.error_message = str(response.status_code), error_message_of(response.content)
        else:
            answer = response.json()
            result.passages_read = len(answer["passages_read"])
            result.prompt_tokens = answer["usage"]["prompt_tokens"]
            result.cached_tokens = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
    except httpx.HTTPError as exc:
        result.error, result.error_message = type(exc).__name__, str(exc)
    result.ended_s = clock()
    return result


async def run_stored_documents(client: httpx.AsyncClient, url: str, model: str, args, cpu) -> dict:
    """The whole mode: upload, ask on schedule (open loop), delete; its report's fields."""
    paths = [Path(f) for f in args.stored_documents]
    asked = json.loads(Path(args.questions_file).read_text()) if args.questions_file else None
    rng = np.random.default_rng(args.seed)
    questions = questions_for([p.name for p in paths], asked)
    specs = make_ask_workload(poisson_times(args.qps, len(paths) * args.questions, rng), questions, args.questions,
                              tuple(args.max_tokens), rng)
    uploading = time.perf_counter()
    ids = await upload(client, url, [p.read_text(encoding="utf-8") for p in paths], args.warm)
    upload_s = time.perf_counter() - uploading
    start = time.perf_counter()

    def clock() -> float:
        return time.perf_counter() - start

    cpu.start()
    try:
        with tqdm(total=len(specs), desc=f"{len(specs)} questions", unit="q", file=sys.stderr) as bar:
            tasks = []
            for spec in specs:
                delay = spec.send_at_s - clock()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(ask(client, url, model, ids[spec.document], spec, args.passages, args.read,
                                                      clock)))
                tasks[-1].add_done_callback(lambda _: bar.update())
            results = await asyncio.gather(*tasks)
    finally:
        await delete(client, url, ids)
    summary = summarize_asks(list(results), clock())
    return {"mode": "stored-documents", "qps": args.qps, "documents": [p.name for p in paths],
            "questions": args.questions, "passages": args.passages, "read": args.read, "warm": args.warm,
            "upload_s": upload_s, **summary,
            "cpu_ms_per_request": cpu.per_request(summary["completed"])}
