"""`k25 bench serve`: an open-loop load generator for the gateway's streamed completions.

Requests arrive as a Poisson process at the offered rate whatever the answers do (open
loop: a slow gateway builds a queue, it does not slow the arrivals). Each request is a
streamed `/v1/completions` call with a prompt of token ids, so its length is exact; the
server-sent events give the time to the first token (TTFT), the gaps between token
events (inter-token latency) and the end-to-end latency. The schedule and the statistics
are plain functions; the HTTP part is `run_workload`.
"""

import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import numpy as np
from tqdm import tqdm

from bench.gateway_counters import read_counters, tier_shares
from bench.process_cpu import CpuMeter, ProcessGone, parse_cpu_of
from bench.serve_basics import CannotBenchmark, error_message_of, poisson_times
from bench.serve_report import report_lines
from bench.serve_stats import RequestResult, highest_qps_held, max_overlap, summarize
from bench.serve_structured import add_tool_call_deltas, is_valid, structured_body

# prompt token ids are drawn from here: ids that every Llama-family vocabulary (32k tokens
# or more) holds, past the special tokens at its start
PROMPT_TOKEN_IDS = (1000, 32000)
PREFLIGHT_TIMEOUT_S = 10.0


# --- the schedule (pure) ------------------------------------------------------------------

@dataclass(frozen=True)
class RequestSpec:
    send_at_s: float  # offset from the run's start
    prompt_token_ids: list[int]
    max_tokens: int
    chat: dict | None = None  # a structured workload's chat body (serve_structured.py) instead of the prompt


def poisson_arrivals(qps: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival offsets in [0, duration_s) of a Poisson process of rate `qps`: exponential
    gaps of mean 1/qps, summed."""
    if qps <= 0 or duration_s <= 0:
        raise ValueError(f"qps and duration must be positive, got {qps} and {duration_s}")
    expected = qps * duration_s
    gaps = rng.exponential(1.0 / qps, size=int(expected + 6 * expected**0.5) + 16)
    arrivals = np.cumsum(gaps)
    while arrivals[-1] < duration_s:  # a draw past six standard deviations: extend it
        arrivals = np.concatenate([arrivals, arrivals[-1] + np.cumsum(rng.exponential(1.0 / qps, size=len(gaps)))])
    return arrivals[arrivals < duration_s]


def make_workload(send_at_s, prompt_tokens: tuple[int, int], max_tokens: tuple[int, int],
                  rng: np.random.Generator, structured: str | None = None) -> list[RequestSpec]:
    """One request per send time, prompt length and max_tokens uniform in their inclusive ranges;
    with `structured`, each a chat request of that structured workload in turn instead."""
    specs = []
    for i, at in enumerate(send_at_s):
        length = int(rng.integers(prompt_tokens[0], prompt_tokens[1] + 1))
        ids = rng.integers(*PROMPT_TOKEN_IDS, size=length).tolist()
        chat = structured_body(structured, i) if structured else None
        specs.append(RequestSpec(float(at), [] if chat else ids, int(rng.integers(max_tokens[0], max_tokens[1] + 1)), chat))
    return specs


def make_document_workload(send_at_s, documents: int, questions: int, document_tokens: int,
                           question_tokens: tuple[int, int], max_tokens: tuple[int, int],
                           rng: np.random.Generator) -> list[RequestSpec]:
    """Document QA: `documents` documents of `document_tokens` tokens, `questions` questions
    about each, every prompt the whole document followed by its question. The questions come
    in rounds, each round asking one question about every document in a fresh random order,
    so that questions about one document are spread over the run and interleave with the
    others'. `send_at_s` needs documents x questions times."""
    if len(send_at_s) != documents * questions:
        raise ValueError(f"{documents} x {questions} questions need as many send times, got {len(send_at_s)}")
    texts = [rng.integers(*PROMPT_TOKEN_IDS, size=document_tokens).tolist() for _ in range(documents)]
    order = [d for _ in range(questions) for d in rng.permutation(documents)]
    specs = []
    for at, d in zip(send_at_s, order):
        question = rng.integers(*PROMPT_TOKEN_IDS, size=int(rng.integers(question_tokens[0], question_tokens[1] + 1))).tolist()
        specs.append(RequestSpec(float(at), texts[d] + question, int(rng.integers(max_tokens[0], max_tokens[1] + 1))))
    return specs



# --- talking to the gateway ---------------------------------------------------------------

def base_url(url: str) -> str:
    """The gateway's root from what a user may pass: with or without a trailing /v1."""
    return url.rstrip("/").removesuffix("/v1")


async def served_model(client: httpx.AsyncClient, url: str, wanted: str | None) -> str:
    """`wanted`, once the gateway confirms it serves it, or else the first model it serves."""
    try:
        response = await client.get(f"{url}/v1/models", timeout=PREFLIGHT_TIMEOUT_S)
    except httpx.UnsupportedProtocol:
        raise CannotBenchmark(f"{url}: not an http:// or https:// URL") from None
    except (httpx.InvalidURL, ValueError) as exc:
        raise CannotBenchmark(f"{url}: not a valid URL ({exc})") from None
    except httpx.HTTPError as exc:
        raise CannotBenchmark(f"cannot reach the gateway at {url} ({type(exc).__name__}: {exc or 'no answer'}); "
                              "is it running? (k25 up)") from None
    if response.status_code != 200:
        raise CannotBenchmark(f"GET {url}/v1/models answered HTTP {response.status_code}: {error_message_of(response.content)}")
    try:
        models = [m["id"] for m in response.json()["data"]]
    except (ValueError, KeyError, TypeError):
        raise CannotBenchmark(f"GET {url}/v1/models did not answer an OpenAI model list; is {url} a K25 gateway?") from None
    if wanted is None:
        if not models:
            raise CannotBenchmark(f"the gateway at {url} serves no model")
        return models[0]
    if wanted not in models:
        raise CannotBenchmark(f"the gateway at {url} does not serve the model {wanted!r}; it serves {', '.join(models)}")
    return wanted


async def stream_completion(client: httpx.AsyncClient, url: str, model: str, spec: RequestSpec,
                            clock: Callable[[], float]) -> RequestResult:
    """Send one streamed, greedy completion (a chat one for a structured workload, whose answer is
    then checked) and time its token events."""
    body = {
        "model": model, "max_tokens": spec.max_tokens, "temperature": 0,
        "stream": True, "stream_options": {"include_usage": True},
    }
    body |= spec.chat if spec.chat else {"prompt": spec.prompt_token_ids}
    result = RequestResult(spec.send_at_s, clock(), 0.0)
    usage_tokens = None
    finished = False
    content, calls = "", []
    try:
        async with client.stream("POST", f"{url}/v1/{'chat/completions' if spec.chat else 'completions'}", json=body) as response:
            if response.status_code != 200:
                result.error, result.error_message = str(response.status_code), error_message_of(await response.aread())
            else:
                async for line in response.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line.removeprefix("data: ")
                    if data == "[DONE]":
                        finished = True
                        break
                    try:
                        event = json.loads(data)
                    except ValueError:
                        result.error, result.error_message = "bad-event", f"not JSON: {data[:200]!r}"
                        break
                    if "error" in event:
                        result.error = f"stream:{event['error'].get('code') or 'error'}"
                        result.error_message = event["error"].get("message", "")
                        break
                    if event.get("usage"):
                        usage_tokens = event["usage"]["completion_tokens"]
                        result.prompt_tokens = event["usage"].get("prompt_tokens", 0)
                        details = event["usage"].get("prompt_tokens_details") or {}
                        result.cached_tokens = details.get("cached_tokens")
                    choices = event.get("choices") or []
                    if choices and spec.chat:
                        delta = choices[0].get("delta") or {}
                        content += delta.get("content") or ""
                        add_tool_call_deltas(calls, delta.get("tool_calls") or [])
                    if choices and choices[0].get("finish_reason") is None:
                        result.token_times_s.append(clock() - result.started_s)
                if result.error is None and not finished:
                    result.error, result.error_message = "incomplete", "the stream ended without [DONE]"
                if result.error is None and spec.chat:
                    result.valid = is_valid(spec.chat, content, calls)
    except httpx.HTTPError as exc:
        result.error, result.error_message = type(exc).__name__, str(exc)
    result.ended_s = clock()
    result.output_tokens = usage_tokens if usage_tokens is not None else len(result.token_times_s)
    return result


async def warm_up(client: httpx.AsyncClient, url: str, model: str, prompt_tokens: int, max_tokens: int,
                  structured: str | None = None) -> None:
    """One unmeasured request, the largest of the workload, before a run: the first engine step and
    the first connection are not what a run measures, and a workload the gateway refuses
    stops here with its reason rather than as a run of failures."""
    spec = RequestSpec(0.0, list(range(PROMPT_TOKEN_IDS[0], PROMPT_TOKEN_IDS[0] + prompt_tokens)), max_tokens,
                       structured_body(structured, 0) if structured else None)
    result = await stream_completion(client, url, model, spec, time.perf_counter)
    if result.error is not None:
        raise CannotBenchmark(f"a first, unmeasured request ({prompt_tokens} prompt tokens, max_tokens {max_tokens}) failed "
                              f"({result.error}): {result.error_message}")


def http_client(timeout_s: float) -> httpx.AsyncClient:
    """One client for the whole run: no cap on connections (the run decides how many are
    open), and a read timeout per request."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout_s, connect=PREFLIGHT_TIMEOUT_S))


async def run_workload(client: httpx.AsyncClient, url: str, model: str, specs: list[RequestSpec],
                       on_done: Callable[[], None] = lambda: None) -> tuple[list[RequestResult], float]:
    """Send each request at its time (open loop) and wait for all; (results, wall seconds)."""
    start = time.perf_counter()

    def clock() -> float:
        return time.perf_counter() - start

    tasks = []
    for spec in specs:
        delay = spec.send_at_s - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(stream_completion(client, url, model, spec, clock))
        task.add_done_callback(lambda _: on_done())
        tasks.append(task)
    results = await asyncio.gather(*tasks)
    return list(results), clock()


async def measure(client: httpx.AsyncClient, url: str, model: str, specs: list[RequestSpec], label: str,
                  cpu: CpuMeter) -> tuple[list[RequestResult], dict]:
    """Run `specs` under a progress bar on stderr; (results, summary), the summary with the CPU
    milliseconds per completed request of each watched process and, from a K25 gateway's counters,
    the share of prompt tokens each KV tier served."""
    cpu.start()
    counted_before = await read_counters(client, url)
    with tqdm(total=len(specs), desc=label, unit="req", file=sys.stderr) as bar:
        results, wall_s = await run_workload(client, url, model, specs, on_done=bar.update)
    summary = summarize(results, wall_s)
    counted_after = await read_counters(client, url) if counted_before is not None else None
    by_tier = tier_shares(counted_before, counted_after) if counted_after is not None else None
    return results, summary | {"cpu_ms_per_request": cpu.per_request(summary["completed"]), "cached_share_by_tier": by_tier}


def streams_at_once(results: list[RequestResult]) -> dict:
    """How many requests were open at once, and how many of those were receiving tokens."""
    streaming = [(r.started_s + r.ttft_s, r.ended_s) for r in results if r.ttft_s is not None]
    return {
        "peak_open": max_overlap([(r.started_s, r.ended_s) for r in results]),
        "peak_streaming": max_overlap(streaming),
    }


# --- the command --------------------------------------------------------------------------

class BadArguments(Exception):
    pass


def _check_args(args) -> list[float] | None:
    """The sweep's levels (None when not sweeping), once every flag has been checked."""
    for name in ("prompt_tokens", "max_tokens"):
        low, high = getattr(args, name)
        if not 1 <= low <= high:
            raise BadArguments(f"--{name.replace('_', '-')} needs 1 <= MIN <= MAX, got {low} {high}")
    if args.duration <= 0 or args.timeout <= 0 or args.ttft_limit_ms <= 0:
        raise BadArguments("--duration, --timeout and --ttft-limit-ms must be positive")
    if args.qps is not None and args.qps <= 0:
        raise BadArguments(f"--qps must be positive, got {args.qps}")
    if args.concurrency_probe is not None and args.concurrency_probe < 1:
        raise BadArguments(f"--concurrency-probe must be at least 1, got {args.concurrency_probe}")
    if args.documents is not None and args.stored_documents:
        raise BadArguments("--documents and --stored-documents are two workloads; give one")
    if args.documents is not None or args.stored_documents:
        if args.qps is None:
            raise BadArguments("--documents and --stored-documents need --qps (the rate at which the questions arrive)")
        counts = (args.documents, args.questions, args.document_tokens, args.passages)
        if any(count is not None and count < 1 for count in counts):
            raise BadArguments("--documents, --questions, --document-tokens and --passages must be at least 1")
    for path in [*(args.stored_documents or []), *([args.questions_file] if args.questions_file else [])]:
        if not os.path.isfile(path):
            raise BadArguments(f"{path}: no such file")
    if args.plot:
        folder = os.path.dirname(os.path.abspath(args.plot))
        if not os.path.isdir(folder):
            raise BadArguments(f"--plot {args.plot}: the folder {folder} does not exist")
    try:
        args.cpu_watched = parse_cpu_of(args.cpu_of)
    except (ValueError, ProcessGone) as exc:
        raise BadArguments(f"--cpu-of: {exc}") from None
    if args.sweep is None:
        return None
    try:
        levels = [float(part) for part in args.sweep.split(",")]
    except ValueError:
        raise BadArguments(f"--sweep expects QPS values separated by commas (e.g. 5,10,20), got {args.sweep!r}") from None
    if not levels or any(q <= 0 for q in levels):
        raise BadArguments(f"--sweep values must be positive, got {args.sweep!r}")
    return sorted(levels)


def run_command(args) -> int:
    """`k25 bench serve`: check the flags, ask the gateway which model it serves, run the
    chosen mode, print its figures (a table, or one JSON object) and draw the plot."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a log line per request over the progress bar
    # Ctrl-C stops the run even when it was started from a shell or harness that ignores
    # SIGINT for background jobs (an ignored signal is inherited, and asyncio then leaves it)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        sweep = _check_args(args)
        report = asyncio.run(_run_mode(args, sweep))
    except (BadArguments, CannotBenchmark) as exc:
        print(f"k25 bench serve: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("k25 bench serve: interrupted", file=sys.stderr)
        return 130
    print(json.dumps(report) if args.json else "\n".join(report_lines(report)))
    return 0


async def _run_mode(args, sweep: list[float] | None) -> dict:
    url = base_url(args.url)
    cpu = CpuMeter(args.cpu_watched)
    async with http_client(args.timeout) as client:
        model = await served_model(client, url, args.model)
        longest = args.prompt_tokens[1] + (args.document_tokens if args.documents else 0)
        await warm_up(client, url, model, longest, args.max_tokens[1], args.structured)
        report = {"url": url, "model": model, "seed": args.seed, "prompt_tokens": list(args.prompt_tokens),
                  "max_tokens": list(args.max_tokens), "structured": args.structured}

        def workload(send_at_s) -> list[RequestSpec]:
            rng = np.random.default_rng(args.seed)
            return make_workload(send_at_s(rng), tuple(args.prompt_tokens), tuple(args.max_tokens), rng, args.structured)

        if sweep is not None:
            levels = []
            for qps in sweep:
                specs = workload(lambda rng, qps=qps: poisson_arrivals(qps, args.duration, rng))
                _, summary = await measure(client, url, model, specs, f"{qps:g} QPS", cpu)
                levels.append({"qps": qps, **summary})
            report |= {"mode": "sweep", "duration_s": args.duration, "ttft_limit_ms": args.ttft_limit_ms,
                       "levels": levels, "highest_qps_held": highest_qps_held(levels, args.ttft_limit_ms)}
            if args.plot:
                from bench.serve_plot import plot_sweep

                plot_sweep(levels, args.ttft_limit_ms, args.plot)
            return report
        if args.stored_documents:
            from bench.serve_documents import run_stored_documents

            return report | await run_stored_documents(client, url, model, args, cpu)
        if args.documents is not None:
            rng = np.random.default_rng(args.seed)
            count = args.documents * args.questions
            specs = make_document_workload(poisson_times(args.qps, count, rng), args.documents, args.questions,
                                           args.document_tokens, tuple(args.prompt_tokens), tuple(args.max_tokens), rng)
            results, summary = await measure(client, url, model, specs, f"{count} questions", cpu)
            report |= {"mode": "documents", "qps": args.qps, "documents": args.documents, "questions": args.questions,
                       "document_tokens": args.document_tokens, **summary}
            title = f"{args.documents} documents x {args.questions} questions at {args.qps:g} QPS"
        elif args.concurrency_probe is not None:
            specs = workload(lambda rng: np.zeros(args.concurrency_probe))
            results, summary = await measure(client, url, model, specs, f"{args.concurrency_probe} streams", cpu)
            report |= {"mode": "concurrency-probe", "streams": args.concurrency_probe, **streams_at_once(results), **summary}
            title = f"{args.concurrency_probe} streams opened at once"
        else:
            specs = workload(lambda rng: poisson_arrivals(args.qps, args.duration, rng))
            results, summary = await measure(client, url, model, specs, f"{args.qps:g} QPS", cpu)
            report |= {"mode": "qps", "qps": args.qps, "duration_s": args.duration, **summary}
            title = f"Poisson {args.qps:g} QPS for {args.duration:g} s"
        if args.plot:
            from bench.serve_plot import plot_run

            plot_run(results, f"{model}: {title}", args.plot)
        return report
