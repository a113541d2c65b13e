"""`k25 bench gpu`: on a machine without CUDA it says so and measures nothing, or with --allow-cpu
runs every section in its reduced size, each recording figures or why it has none; a section
that fails or runs past its budget records that, and the run goes on."""

import json
import subprocess
import sys

import pytest
import torch

from bench.gpu_check import STOP_GRACE_S, run_section
from bench.gpu_plan import GPU_TOTAL_BUDGET_S, cpu_plan

K25 = [sys.executable, "-m", "k25.cli"]
SECTIONS = {"graph_replay", "attention", "decode_roofline", "serve_k25", "serve_vllm", "kv_tiers"}
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="what a run does where no CUDA device is")


def bench_gpu(tmp_path, *flags: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "gpu.json"
    done = subprocess.run([*K25, "bench", "gpu", "--out", str(out), *flags], capture_output=True, text=True, timeout=900,
                          check=False)
    return done, json.loads(out.read_text())


def test_a_run_on_a_gpu_ends_within_8_minutes():
    """Sections start only within the run's total budget, and the last may overrun it by the
    time it is given to stop."""
    assert GPU_TOTAL_BUDGET_S + STOP_GRACE_S <= 8 * 60


def test_every_section_has_a_cpu_size():
    assert {section.name for section in cpu_plan().sections} == SECTIONS


def test_a_section_that_fails_records_its_error():
    result = run_section("json:loads", {"s": "not json"}, budget_s=60)
    assert result["status"] == "error" and result["error"].startswith("JSONDecodeError")
    assert "Traceback" in result["traceback"]


def test_a_section_past_its_budget_is_stopped_and_says_so():
    result = run_section("subprocess:call", {"args": ["sleep", "60"]}, budget_s=1)
    assert result["status"] == "error" and result["error"] == "ran past its budget of 1 s"


@no_cuda
def test_without_cuda_it_says_so_and_measures_nothing(tmp_path):
    done, report = bench_gpu(tmp_path)
    assert done.returncode == 1
    assert "no CUDA device is present" in done.stderr
    assert report["cuda_available"] is False and report["device"].startswith("cpu")
    assert set(report["sections"]) == SECTIONS
    assert all(s["status"] == "skipped" and "no CUDA device" in s["reason"] for s in report["sections"].values())


@no_cuda
@pytest.mark.slow  # every section in a process of its own, a `k25 up` stack among them: about a minute
def test_allow_cpu_runs_every_section_in_its_reduced_size(tmp_path):
    done, report = bench_gpu(tmp_path, "--allow-cpu", "--quick")
    assert done.returncode == 0, done.stderr
    assert "no CUDA device is present" in done.stderr
    for key in ("device", "torch", "cuda", "triton", "python", "git_commit"):
        assert key in report
    sections = report["sections"]
    assert set(sections) == SECTIONS
    assert set(report["section_wall_s"]) == SECTIONS - {"serve_vllm"}
    assert sections["serve_vllm"]["status"] == "skipped" and "k25 backend only" in sections["serve_vllm"]["reason"]
    assert report["serve_output_tokens_per_s_k25_over_vllm"] is None
    figures = {name: s["figures"] for name, s in sections.items() if name != "serve_vllm"}
    assert all(sections[name]["status"] == "ok" for name in figures), sections

    replay = figures["graph_replay"]
    assert replay["graphs_captured"] is False and "both runs were eager" in replay["note"]
    assert replay["all_tokens_match"] and replay["tokens_compared"] == sum(replay["max_tokens"])

    attention = figures["attention"]
    assert attention["interpreted"] and attention["all_within_bound"]
    by_dtype = {case["dtype"]: case for case in attention["cases"]}
    assert "CUDA only" in by_dtype["bfloat16"]["skipped"]
    for dtype in ("float32", "float16"):
        assert 0 <= by_dtype[dtype]["max_abs_error"] <= by_dtype[dtype]["bound"]

    decode = figures["decode_roofline"]
    assert decode["memory_bandwidth_bytes_per_s"] > 0 and [row["batch"] for row in decode["batches"]] == [1, 4]
    small, large = decode["batches"]
    assert large["bytes_read"] > small["bytes_read"]  # each sequence's KV on top of the same weights
    assert all(row["step_ms"] > 0 and row["step_over_bandwidth_limit"] > 0 for row in decode["batches"])

    serve = figures["serve_k25"]
    assert serve["completed"] == 4 and serve["failed"] == 0 and serve["output_tokens_per_s"] > 0
    assert serve["report"]["output_tokens"] == 4 * 4

    tiers = figures["kv_tiers"]
    assert "no CUDA device" in tiers["note"] and tiers["host_pool_pinned"] is False
    # every document after the first round came back from host memory, and answered the same
    assert tiers["all_tokens_match"] and tiers["questions"] == 6
    assert tiers["restored_blocks"] > 0 and tiers["host_hit_tokens"] > 0 and tiers["bytes_to_device"] > 0
