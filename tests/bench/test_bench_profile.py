"""`k25 bench profile`: its workload, its refusals of flags that cannot work, and a small real
run on the tiny model (the decision itself: tests/engine/hardware/test_chunk_choice.py)."""

import json
import subprocess
import sys

import pytest

from bench.profile_workload import DISTRIBUTIONS, default_candidates, make_requests, parse_candidates, parse_lengths
from k25.cli import build_parser

K25 = [sys.executable, "-m", "k25.cli"]


def test_lengths_are_a_named_distribution_or_chunk_counts():
    assert parse_lengths("short") == (1,) and parse_lengths("documents") == DISTRIBUTIONS["documents"]
    assert sum(DISTRIBUTIONS["documents"]) / len(DISTRIBUTIONS["documents"]) == 6
    assert parse_lengths("1,2,6") == (1, 2, 6)


def test_a_request_of_n_chunks_fills_n_chunks_with_its_prompt_and_output():
    requests = make_requests(1000, 32, (1, 3), 20, 4, None, seed=7)
    assert {r.chunks for r in requests} == {1, 3}
    assert all(len(r.prompt) + r.max_tokens == r.chunks * 32 for r in requests)
    assert all(r.arrival_s == 0 for r in requests)  # all at once
    assert make_requests(1000, 32, (1, 3), 20, 4, None, seed=7) == requests  # the seed fixes it


def test_poisson_arrivals_rise_at_about_the_asked_rate():
    arrivals = [r.arrival_s for r in make_requests(1000, 32, (1,), 400, 4, 50.0, seed=0)]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0
    assert 400 / 50 * 0.8 < arrivals[-1] < 400 / 50 * 1.2


def test_default_candidates_climb_from_the_longest_request_to_the_cap():
    assert default_candidates(1, 16) == (1, 2, 4, 6, 8, 12, 16)
    assert default_candidates(7, 112) == (7, 8, 12, 16, 24, 32, 48, 64, 96, 112)
    assert default_candidates(3, 3) == (3,)
    assert parse_candidates("8,2,2,4") == (2, 4, 8)


def refusal(argv: list[str], capsys) -> str:
    args = build_parser().parse_args(["bench", "profile", "--model", "tiny-random", "--dtype", "float32", *argv])
    assert args.handler(args) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
    assert line.startswith("k25 bench profile: ")
    return line


@pytest.mark.parametrize("argv, message", [
    (["--lengths", "six"], "--lengths must be short or documents or chunk counts such as 1,2,6; got 'six'"),
    (["--lengths", "0,2"], "--lengths: every chunk count must be at least 1"),
    (["--candidates", "2,x"], "--candidates must be whole numbers separated by commas"),
    (["--candidates", "0,2"], "--candidates must be at least 1"),
    (["--requests", "0"], "--requests must be at least 1, got 0"),
    (["--rounds", "0"], "--rounds must be at least 1, got 0"),
    (["--qps", "0"], "--qps must be positive, got 0.0"),
    (["--throughput-tolerance", "1"], "--throughput-tolerance must be in [0, 1), got 1.0"),
    (["--latency-tolerance", "-0.1"], "--latency-tolerance must be in [0, 1), got -0.1"),
    (["--plot", "/no/such/folder/p.png"], "--plot: no folder /no/such/folder"),
    # these load the model and read the engine's memory budget
    (["--chunk-size", "32", "--max-tokens", "32"], "--max-tokens must be at least 1 and below the chunk size 32, got 32"),
    (["--chunk-size", "32", "--lengths", "4", "--candidates", "2,4"],
     "--candidates: 2 cannot hold the longest request (4 chunks)"),
    (["--chunk-size", "32", "--candidates", "100000000"], "--candidates: 100000000 does not fit; the largest"),
    (["--chunk-size", "256", "--lengths", "1000"], "--lengths: a request of 1000 chunks of 256 tokens is longer than"),
])
def test_flags_that_cannot_work_are_refused_with_a_message(argv, message, capsys):
    assert message in refusal(argv, capsys)


def test_help_names_the_flags_and_the_rule():
    text = subprocess.run([*K25, "bench", "profile", "--help"], capture_output=True, text=True, timeout=60).stdout
    for flag in ("--lengths", "--requests", "--qps", "--candidates", "--throughput-tolerance", "--latency-tolerance",
                 "--json", "--plot", "--max-num-seqs", "--dtype"):
        assert flag in text
    assert "smallest value whose throughput is within" in " ".join(text.split())


@pytest.mark.slow  # runs the engine 4 times in a subprocess
def test_a_small_profile_prints_the_curve_and_a_recommendation_that_fits(tmp_path):
    plot = tmp_path / "profile.png"
    result = subprocess.run(
        [*K25, "bench", "profile", "--model", "tiny-random", "--dtype", "float32", "--chunk-size", "32", "--lengths", "1,2",
         "--requests", "6", "--max-tokens", "4", "--candidates", "2,4,12", "--qps", "200", "--rounds", "1", "--json",
         "--plot", str(plot)],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    plan = report["plan"]
    assert min(plan["budget_bytes"], plan["weight_bytes"], plan["activation_bytes"], plan["chunk_kv_bytes"]) > 0
    largest = plan["largest_max_chunk_per_gpu"]
    assert largest == (plan["budget_bytes"] - plan["weight_bytes"] - plan["activation_bytes"]) // plan["chunk_kv_bytes"]
    assert [m["max_chunk_per_gpu"] for m in report["measured"]] == [2, 4, 12]
    for m in report["measured"]:
        assert m["tokens_per_s"] > 0 and 0 < m["p50_latency_s"] <= m["p95_latency_s"] and m["preemptions"] >= 0
    assert report["recommended"]["value"] in (2, 4, 12) and report["recommended"]["value"] <= largest
    assert "the smallest value with throughput within 5% of the best" in report["recommended"]["reason"]
    assert report["lengths"] == [1, 2] and report["qps"] == 200 and "Poisson at 200 req/s" in report["workload"]
    assert report["rounds"] == 1
    assert plot.read_bytes().startswith(b"\x89PNG")
    assert "bench profile" in result.stderr  # the progress bar


@pytest.mark.slow
def test_the_table_names_the_memory_the_curve_and_why(tmp_path):
    result = subprocess.run(
        [*K25, "bench", "profile", "--model", "tiny-random", "--dtype", "float32", "--chunk-size", "32", "--lengths", "1",
         "--requests", "3", "--max-tokens", "4", "--candidates", "1,3"],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for fragment in ("memory         budget 2,048.0 MiB = weights", "largest fit    max_chunk_per_gpu ",
                     "3 requests of 1 chunks of 32 tokens (prompt + 4 generated), all at once, seed 0; best of 2 rounds",
                     "recommended    --max-chunk-per-gpu ", "why            the smallest value"):
        assert fragment in out
    assert out.count("<- recommended") == 1
