"""The stored-document workload of `k25 bench serve`: its schedule and statistics as plain
functions, its flags' errors, and a short run against a real `k25 up --model tiny-random` stack
(real chunker and Redis) whose documents are uploaded, asked about by id and deleted."""

import json
import signal
import subprocess
import sys

import httpx
import numpy as np
import pytest

from bench.serve_basics import poisson_times
from bench.serve_documents import REVIEW_QUESTIONS, AskResult, AskSpec, make_ask_workload, questions_for, summarize_asks
from k25.cli import main
from tests.helpers.gateway_process import start_stack
from tests.helpers.paths import CONTRACTS

K25 = [sys.executable, "-m", "k25.cli"]
FILES = [str(CONTRACTS / name) for name in ("en_master_services_agreement.txt", "zh_software_license.txt",
                                            "en_10k_risk_factors.txt")]


def test_questions_come_from_the_file_that_names_the_document_else_from_a_review():
    asked = {"a.txt": [{"question": "Who signs?", "clause": "x"}, {"question": "When?"}]}
    assert questions_for(["a.txt", "b.txt"], asked) == [["Who signs?", "When?"], REVIEW_QUESTIONS]
    assert questions_for(["a.txt"], None) == [REVIEW_QUESTIONS]


def test_every_document_is_asked_once_a_round_its_questions_in_turn():
    rng = np.random.default_rng(5)
    questions = [["a1", "a2"], ["b1", "b2", "b3"], ["c1"]]
    specs = make_ask_workload(poisson_times(2.0, 9, rng), questions, 3, (4, 4), rng)
    for nth in range(3):  # each round asks about every document once, each its nth question
        round_ = specs[3 * nth: 3 * nth + 3]
        assert sorted(s.document for s in round_) == [0, 1, 2] and {s.nth for s in round_} == {nth}
        assert all(s.question == questions[s.document][nth % len(questions[s.document])] for s in round_)
    assert [s.send_at_s for s in specs] == sorted(s.send_at_s for s in specs) and specs[0].send_at_s == 0.0
    with pytest.raises(ValueError, match="need as many send times"):
        make_ask_workload([0.0], questions, 3, (4, 4), rng)


def result(nth: int, seconds: float, read: int = 4, prompt: int = 100, cached: int = 0, error=None) -> AskResult:
    return AskResult(AskSpec(0.0, 0, "q", nth, 8), 1.0, 1.0 + seconds, read, prompt, cached, error, "why" if error else "")


def test_a_document_s_first_questions_are_reported_apart_from_the_later_ones():
    summary = summarize_asks([result(0, 10.0), result(0, 20.0, read=2), result(1, 3.0, cached=60), result(2, 1.0, cached=90),
                              result(1, 0.0, error="503")], wall_s=30.0)
    assert (summary["requests"], summary["completed"], summary["failed"], summary["errors"]) == (5, 4, 1, {"503": 1})
    assert summary["first_question_ms"]["p50"] == 15000.0 and summary["later_questions_ms"]["p50"] == 2000.0
    assert summary["later_to_first_p50"] == pytest.approx(2 / 15)
    assert summary["passages_read"] == {"mean": 3.5, "min": 2, "max": 4}
    assert summary["cached_share"] == 150 / 400 and summary["questions_with_cache_hits"] == 2


@pytest.mark.parametrize("flags, message", [
    (["--concurrency-probe", "2", "--stored-documents", FILES[0]], "need --qps"),
    (["--qps", "1", "--stored-documents", "/no/such.txt"], "/no/such.txt: no such file"),
    (["--qps", "1", "--stored-documents", FILES[0], "--questions-file", "/no/q.json"], "/no/q.json: no such file"),
    (["--qps", "1", "--stored-documents", FILES[0], "--passages", "0"], "must be at least 1"),
    (["--qps", "1", "--stored-documents", FILES[0], "--documents", "2"], "two workloads; give one"),
])
def test_bad_flags_are_refused_with_a_clear_message(flags, message, capsys):
    assert main(["bench", "serve", *flags]) == 2
    assert message in capsys.readouterr().err


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stack")
    service = start_stack(str(folder / "up.log"), "--model", "tiny-random", "--log-dir", str(folder))
    yield service
    service.stop(signal.SIGINT)


@pytest.mark.slow
def test_stored_documents_are_asked_by_id_and_deleted_after(stack):
    run = subprocess.run([*K25, "bench", "serve", "--url", stack.url, "--qps", "2", "--stored-documents", *FILES,
                          "--questions", "2", "--passages", "2", "--max-tokens", "2", "2", "--questions-file",
                          str(CONTRACTS / "questions.json"), "--json"], capture_output=True, text=True, timeout=600,
                         check=False)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert (report["mode"], report["requests"], report["completed"]) == ("stored-documents", 6, 6)
    assert report["passages_read"] == {"mean": 2.0, "min": 2, "max": 2}
    assert report["first_question_ms"]["count"] == 3 and report["later_questions_ms"]["count"] == 3
    assert report["upload_s"] > 0 and report["read"] is None  # the gateway's default
    assert report["cached_share"] is not None and 0 <= report["cached_share"] <= 1
    assert httpx.get(f"{stack.url}/v1/documents").json()["data"] == []
    lines = subprocess.run([*K25, "bench", "serve", "--url", stack.url, "--qps", "2", "--stored-documents", FILES[0],
                            "--questions", "1", "--max-tokens", "1", "1", "--warm", "--read", "notes"], capture_output=True,
                           text=True, timeout=600, check=False).stdout
    assert "1 stored documents (warmed)" in lines and "passages read" in lines and "first" in lines
    assert "questions each by id, passages read notes," in lines
