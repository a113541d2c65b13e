"""`k25 bench serve`: the arrival schedule and the statistics checked against independent
references (the laws of the exponential and Poisson distributions, numpy's percentiles,
figures worked out by hand), the command's error paths, and short runs against a real
`k25 up --model tiny-random` stack whose gateway's own Prometheus counters confirm what the
benchmark saw."""

import asyncio
import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from bench.serve import (
    PROMPT_TOKEN_IDS,
    RequestSpec,
    make_document_workload,
    make_workload,
    poisson_arrivals,
    poisson_times,
    stream_completion,
)
from bench.process_cpu import CpuMeter, cpu_seconds
from bench.serve_stats import RequestResult, cached_share, highest_qps_held, max_overlap, percentile, summarize
from k25.cli import main
from proto import k25_pb2
from services.gateway.errors import OpenAIError, overloaded
from services.gateway.responses import sse, text_chunk, usage_chunk
from tests.helpers.gateway_process import start_stack
from tests.helpers.redis_server import free_port

K25 = [sys.executable, "-m", "k25.cli"]


# --- the schedule ---------------------------------------------------------------------------

def test_poisson_arrivals_have_exponential_gaps_and_poisson_counts():
    qps, duration = 40.0, 250.0
    arrivals = poisson_arrivals(qps, duration, np.random.default_rng(7))
    n = len(arrivals)
    assert abs(n - qps * duration) < 4 * math.sqrt(qps * duration)  # Poisson count: mean = variance = qps * duration
    assert arrivals[0] >= 0 and arrivals[-1] < duration and np.all(np.diff(arrivals) > 0)

    gaps = np.diff(np.concatenate([[0.0], arrivals]))
    assert abs(gaps.mean() * qps - 1) < 0.03  # the standard error of the mean is 1%
    # Kolmogorov-Smirnov distance to the exponential CDF 1 - exp(-qps x), against its 1% critical value
    ordered = np.sort(gaps)
    cdf = 1 - np.exp(-qps * ordered)
    distance = max(np.max(np.arange(1, n + 1) / n - cdf), np.max(cdf - np.arange(n) / n))
    assert distance < 1.63 / math.sqrt(n)
    # counts in 1-second windows are Poisson: variance / mean near 1 (its standard error is ~0.09 here)
    counts = np.bincount(arrivals.astype(int), minlength=int(duration))
    assert 0.7 < counts.var() / counts.mean() < 1.3


def test_poisson_arrivals_follow_the_seed():
    first = poisson_arrivals(10, 30, np.random.default_rng(1))
    assert np.array_equal(first, poisson_arrivals(10, 30, np.random.default_rng(1)))
    assert not np.array_equal(first, poisson_arrivals(10, 30, np.random.default_rng(2)))


@pytest.mark.parametrize("qps, duration", [(0, 10), (-1, 10), (5, 0)])
def test_poisson_arrivals_refuse_a_non_positive_rate_or_duration(qps, duration):
    with pytest.raises(ValueError, match="must be positive"):
        poisson_arrivals(qps, duration, np.random.default_rng(0))


def test_workload_lengths_cover_their_inclusive_ranges():
    specs = make_workload(np.arange(2000) / 100, (3, 6), (1, 4), np.random.default_rng(0))
    assert [s.send_at_s for s in specs] == list(np.arange(2000) / 100)
    assert {len(s.prompt_token_ids) for s in specs} == {3, 4, 5, 6}
    assert {s.max_tokens for s in specs} == {1, 2, 3, 4}
    ids = [t for s in specs for t in s.prompt_token_ids]
    assert PROMPT_TOKEN_IDS[0] <= min(ids) and max(ids) < PROMPT_TOKEN_IDS[1]


# --- statistics -----------------------------------------------------------------------------

@pytest.mark.parametrize("size", [1, 2, 3, 10, 101, 1000])
def test_percentile_matches_numpy(size):
    values = np.random.default_rng(size).lognormal(size=size).tolist()
    for q in (0, 1, 37.5, 50, 95, 99, 99.9, 100):
        assert percentile(values, q) == pytest.approx(np.percentile(values, q), rel=1e-12)


def test_percentile_of_nothing_is_an_error():
    with pytest.raises(ValueError):
        percentile([], 50)


def _ok(send_at, started, token_times, ended, tokens):
    return RequestResult(send_at, started, ended, token_times, tokens)


def test_summary_of_known_samples():
    results = [
        # TTFT 10, 20, 30, 40 ms; end-to-end 100, 200, 300, 400 ms; token gaps 5, 10 | 20 | - | 5, 5, 10 ms
        _ok(0.000, 0.001, [0.010, 0.015, 0.025], 0.101, 3),
        _ok(0.100, 0.102, [0.020, 0.040], 0.302, 2),
        _ok(0.200, 0.203, [0.030], 0.503, 1),
        _ok(0.300, 0.304, [0.040, 0.045, 0.050, 0.060], 0.704, 4),
        RequestResult(0.4, 0.405, 0.41, error="503", error_message="every engine is at capacity"),
        RequestResult(0.5, 0.506, 0.51, error="503", error_message="a later 503"),
        RequestResult(0.6, 0.607, 0.9, [0.01], 1, error="stream:engine_lost", error_message="engine went away"),
    ]
    s = summarize(results, wall_s=2.0)
    assert (s["requests"], s["completed"], s["failed"], s["errors_503"]) == (7, 4, 3, 2)
    assert s["errors"] == {"503": 2, "stream:engine_lost": 1}
    assert s["error_examples"] == {"503": "every engine is at capacity", "stream:engine_lost": "engine went away"}
    assert s["requests_per_s"] == 2.0 and s["output_tokens"] == 10 and s["output_tokens_per_s"] == 5.0
    # linear interpolation between closest ranks, by hand: p95 of 10..40 sits at rank 2.85
    assert s["ttft_ms"]["p50"] == pytest.approx(25.0)
    assert s["ttft_ms"]["p95"] == pytest.approx(38.5)
    assert s["ttft_ms"]["p99"] == pytest.approx(39.7)
    assert (s["ttft_ms"]["mean"], s["ttft_ms"]["max"], s["ttft_ms"]["count"]) == (pytest.approx(25.0), pytest.approx(40.0), 4)
    assert s["e2e_ms"]["p50"] == pytest.approx(250.0) and s["e2e_ms"]["max"] == pytest.approx(400.0)
    # gaps 5, 5, 5, 10, 10, 20: the median lies between 5 and 10
    assert s["itl_ms"]["count"] == 6 and s["itl_ms"]["p50"] == pytest.approx(7.5)
    assert s["itl_ms"]["mean"] == pytest.approx(55 / 6) and s["itl_ms"]["max"] == pytest.approx(20.0)
    # send lag covers every request, failed ones too: 1..7 ms
    assert s["send_lag_ms"]["count"] == 7 and s["send_lag_ms"]["p50"] == pytest.approx(4.0)


def test_summary_without_a_success_has_no_latencies():
    s = summarize([RequestResult(0, 0, 1, error="ConnectError", error_message="refused")], wall_s=1.0)
    assert s["completed"] == 0 and s["ttft_ms"]["p99"] is None and s["ttft_ms"]["count"] == 0
    assert s["errors"] == {"ConnectError": 1} and s["errors_503"] == 0


def test_cpu_seconds_agree_with_the_process_own_clock():
    """/proc's count for this process against Python's time.process_time (the same user + system
    time, read another way), around a loop that runs until that clock has moved 0.2 s."""
    tick = 1 / os.sysconf("SC_CLK_TCK")
    before, clock = cpu_seconds(os.getpid()), time.process_time()
    while time.process_time() - clock < 0.2:
        pass
    used, clock_used = cpu_seconds(os.getpid()) - before, time.process_time() - clock
    assert abs(used - clock_used) <= 2 * tick + 0.01, (used, clock_used)


def test_cpu_per_request_divides_by_what_completed():
    meter = CpuMeter({"me": os.getpid()})
    meter.start()
    assert set(meter.per_request(0)) == {"me"} and meter.per_request(0)["me"] is None
    assert meter.per_request(4)["me"] >= 0


def test_max_overlap():
    assert max_overlap([]) == 0
    assert max_overlap([(0, 2), (2, 4)]) == 1  # one ends as the next starts
    assert max_overlap([(0, 2), (1, 3), (2, 4), (5, 6)]) == 2
    assert max_overlap([(0, 10), (1, 2), (1.5, 3), (2.5, 4)]) == 3


def _level(qps, p99, failed=0):
    return {"qps": qps, "failed": failed, "ttft_ms": {"p99": p99}}


def test_highest_qps_held_needs_no_failure_and_p99_under_the_limit():
    levels = [_level(5, 20), _level(10, 60), _level(20, 99.9), _level(40, 150), _level(80, 30, failed=1)]
    assert highest_qps_held(levels, 100) == 20
    assert highest_qps_held(levels, 50) == 5
    assert highest_qps_held(levels, 10) is None
    assert highest_qps_held([_level(5, None, failed=3)], 100) is None


# --- reading one stream ------------------------------------------------------------------------
# The events are written by the gateway's own serialisers (services.gateway.responses/errors);
# httpx's MockTransport stands in for the network only.

def _read_stream(body: str, status: int = 200) -> RequestResult:
    transport = httpx.MockTransport(lambda request: httpx.Response(status, text=body, headers={"content-type": "text/event-stream"}))

    async def read():
        async with httpx.AsyncClient(transport=transport) as client:
            return await stream_completion(client, "http://gateway", "m", RequestSpec(0.0, [1000, 1001], 8), time.perf_counter)

    return asyncio.run(read())


def test_a_stream_counts_token_events_and_takes_output_tokens_from_usage():
    events = [text_chunk("cmpl-1", 0, "m", text) for text in ("He", "", "llo")]
    events += [text_chunk("cmpl-1", 0, "m", "", "length"), usage_chunk("cmpl-1", 0, "m", False, k25_pb2.Usage(prompt_tokens=2, completion_tokens=5))]
    result = _read_stream("".join(map(sse, events)) + sse("[DONE]"))
    assert result.error is None and len(result.token_times_s) == 3 and result.output_tokens == 5
    assert result.token_times_s == sorted(result.token_times_s) and result.ended_s >= result.started_s


def test_an_error_event_mid_stream_counts_by_its_code():
    error = OpenAIError(502, "engine e1 went away mid-answer; the answer is incomplete", "server_error", "engine_lost")
    result = _read_stream(sse(text_chunk("cmpl-1", 0, "m", "Hi")) + sse(error.body()))
    assert result.error == "stream:engine_lost" and "went away" in result.error_message
    assert len(result.token_times_s) == 1


def test_an_error_status_counts_by_status_with_the_gateways_message():
    result = _read_stream(json.dumps(overloaded("every engine is at capacity; try again shortly").body()), status=503)
    assert (result.error, result.error_message) == ("503", "every engine is at capacity; try again shortly")


def test_a_stream_without_done_or_with_a_non_json_event_is_an_error():
    assert _read_stream(sse(text_chunk("cmpl-1", 0, "m", "Hi"))).error == "incomplete"
    result = _read_stream("data: {half an event\n\n")
    assert result.error == "bad-event" and "half an event" in result.error_message


def test_document_workload_asks_every_document_in_interleaved_rounds():
    rng = np.random.default_rng(3)
    specs = make_document_workload(poisson_times(2.0, 12, rng), 3, 4, 100, (5, 9), (2, 2), rng)
    documents = {tuple(s.prompt_token_ids[:100]) for s in specs}
    assert len(specs) == 12 and len(documents) == 3
    order = [sorted(documents).index(tuple(s.prompt_token_ids[:100])) for s in specs]
    for round_ in range(4):  # each round asks about every document once
        assert sorted(order[3 * round_: 3 * round_ + 3]) == [0, 1, 2]
    assert all(5 <= len(s.prompt_token_ids) - 100 <= 9 and s.max_tokens == 2 for s in specs)
    times = [s.send_at_s for s in specs]
    assert times[0] == 0.0 and times == sorted(times)
    with pytest.raises(ValueError, match="need as many send times"):
        make_document_workload([0.0], 3, 4, 100, (5, 9), (2, 2), rng)


def test_cached_share_counts_only_what_the_server_reported():
    reported = [RequestResult(0, 0, 1, prompt_tokens=100, cached_tokens=80), RequestResult(0, 0, 1, prompt_tokens=100, cached_tokens=0)]
    assert cached_share(reported) == 0.4
    assert cached_share([RequestResult(0, 0, 1, prompt_tokens=100)]) is None


# --- the command's errors ---------------------------------------------------------------------

@pytest.mark.parametrize("flags, message", [
    (["--qps", "0"], "--qps must be positive"),
    (["--qps", "1", "--duration", "0"], "must be positive"),
    (["--qps", "1", "--prompt-tokens", "10", "5"], "--prompt-tokens needs 1 <= MIN <= MAX"),
    (["--qps", "1", "--max-tokens", "0", "4"], "--max-tokens needs 1 <= MIN <= MAX"),
    (["--sweep", "1,fast"], "--sweep expects QPS values"),
    (["--sweep", "2,-1"], "--sweep values must be positive"),
    (["--concurrency-probe", "0"], "--concurrency-probe must be at least 1"),
    (["--qps", "1", "--plot", "/no/such/folder/out.png"], "the folder /no/such/folder does not exist"),
    (["--qps", "1", "--url", "localhost:8000"], "not an http:// or https:// URL"),
    (["--concurrency-probe", "2", "--documents", "2"], "--documents and --stored-documents need --qps"),
    (["--qps", "1", "--documents", "2", "--questions", "0"], "must be at least 1"),
    (["--qps", "1", "--cpu-of", "gateway"], "--cpu-of expects NAME=PID"),
    (["--qps", "1", "--cpu-of", "gateway=999999999"], "no process 999999999"),
])
def test_bad_flags_are_refused_with_a_clear_message(flags, message, capsys):
    assert main(["bench", "serve", *flags]) == 2
    assert message in capsys.readouterr().err


def test_a_url_where_no_gateway_listens_is_a_clear_error_not_a_traceback():
    url = f"http://127.0.0.1:{free_port()}"
    result = subprocess.run([*K25, "bench", "serve", "--url", url, "--qps", "1", "--duration", "1"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert f"cannot reach the gateway at {url}" in result.stderr and "k25 up" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


# --- against a real stack --------------------------------------------------------------------

@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stack")
    service = start_stack(str(folder / "up.log"), "--model", "tiny-random", "--log-dir", str(folder))
    yield service
    service.stop(signal.SIGINT)


def bench(stack, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([*K25, "bench", "serve", "--url", stack.url, *flags], capture_output=True, text=True, timeout=600)


def answered_200(stack) -> float:
    """The gateway's own count of requests it answered with 200."""
    import urllib.request

    with urllib.request.urlopen(f"{stack.url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "k25_gateway_requests_total" and sample.labels["status"] == "200")


@pytest.mark.slow
def test_poisson_run_reports_what_the_gateway_counted_and_draws_a_png(stack, tmp_path):
    before = answered_200(stack)
    png = tmp_path / "serve.png"
    result = bench(stack, "--qps", "5", "--duration", "3", "--prompt-tokens", "16", "64", "--max-tokens", "4", "8",
                   "--json", "--plot", str(png), "--cpu-of", f"stack={stack.process.pid}")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["mode"], report["model"], report["qps"], report["duration_s"]) == ("qps", "tiny-random", 5.0, 3.0)
    n = report["requests"]
    assert n > 0 and report["completed"] == n and report["failed"] == 0 and report["errors"] == {}
    assert answered_200(stack) - before == n + 1  # and the one warm-up request
    assert n <= report["output_tokens"] <= 8 * n
    assert report["output_tokens_per_s"] == pytest.approx(report["output_tokens"] / report["wall_s"])
    assert report["wall_s"] > 0 and report["requests_per_s"] == pytest.approx(n / report["wall_s"])
    for key in ("ttft_ms", "itl_ms", "e2e_ms", "send_lag_ms"):
        stats = report[key]
        assert 0 <= stats["p50"] <= stats["p95"] <= stats["p99"] <= stats["max"], key
    assert report["ttft_ms"]["count"] == report["e2e_ms"]["count"] == n
    assert report["ttft_ms"]["max"] < report["e2e_ms"]["max"]
    assert "5 QPS" in result.stderr  # the progress bar
    assert set(report["cpu_ms_per_request"]) == {"stack"} and report["cpu_ms_per_request"]["stack"] >= 0
    with Image.open(png) as image:
        assert image.format == "PNG"
        image.verify()


@pytest.mark.slow
def test_document_qa_reports_the_share_of_prompt_served_from_cache(stack):
    result = bench(stack, "--qps", "4", "--documents", "2", "--questions", "3", "--document-tokens", "160",
                   "--prompt-tokens", "8", "8", "--max-tokens", "2", "2", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["mode"], report["requests"], report["completed"]) == ("documents", 6, 6)
    # one engine: at most, each document is computed once and found for its next two questions
    # (all 10 of its blocks of 16); a question that arrives while its document is still being
    # computed finds less
    assert report["cached_share"] is not None and 0 <= report["cached_share"] <= 4 * 160 / (6 * 168)
    # the gateway's counters saw the same prompts: the tiers' shares add up to what the answers said
    assert sum(report["cached_share_by_tier"].values()) == pytest.approx(report["cached_share"])
    assert "prefix cache" in bench(stack, "--qps", "4", "--documents", "1", "--questions", "1", "--document-tokens", "16",
                                   "--prompt-tokens", "4", "4", "--max-tokens", "1", "1").stdout


@pytest.mark.slow
def test_concurrency_probe_holds_every_stream_open_at_once(stack):
    result = bench(stack, "--concurrency-probe", "20", "--prompt-tokens", "16", "16", "--max-tokens", "4", "4", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["mode"], report["streams"], report["requests"], report["completed"]) == ("concurrency-probe", 20, 20, 20)
    assert report["peak_open"] == 20 and 1 <= report["peak_streaming"] <= 20


@pytest.mark.slow
def test_sweep_reads_off_the_highest_level_held(stack, tmp_path):
    png = tmp_path / "sweep.png"
    result = bench(stack, "--sweep", "4,2", "--duration", "1.5", "--prompt-tokens", "16", "32", "--max-tokens", "2", "4",
                   "--ttft-limit-ms", "60000", "--plot", str(png))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines if re.match(r"\s+\d", line)] == ["2", "4"]  # in increasing order
    assert lines[-1] == "highest QPS held at p99 TTFT < 60000 ms: 4"
    with Image.open(png) as image:
        image.verify()


@pytest.mark.slow
@pytest.mark.parametrize("flags, message", [
    (["--model", "no-such-model"], "does not serve the model 'no-such-model'; it serves tiny-random"),
    (["--prompt-tokens", "9000", "9000"], "failed (400)"),
])
def test_a_workload_the_gateway_refuses_stops_before_the_run(stack, flags, message):
    result = bench(stack, "--qps", "1", "--duration", "1", *flags)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_ctrl_c_stops_a_run_with_a_message_not_a_traceback(stack):
    before = answered_200(stack)
    process = subprocess.Popen([*K25, "bench", "serve", "--url", stack.url, "--qps", "2", "--duration", "600",
                                "--prompt-tokens", "16", "16", "--max-tokens", "2", "2"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while answered_200(stack) < before + 2 and time.monotonic() < deadline:  # the warm-up and one measured request
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130
    assert "k25 bench serve: interrupted" in err and "Traceback" not in err and out == ""
