"""`k25 bench gpu`: every GPU figure the engines owe, measured in one run that writes one JSON
file; bench/gpu_plan.py says what and how big.

Each section, and the look at the device, runs in a Python process of its own under its time
budget: one that fails or runs past it records why, and the next one still runs; each finds the
GPU's memory free (an engine sizes its KV cache from it, and `k25 up` starts engines that do);
and what must be set before a section's first import (TRITON_INTERPRET) is set for it alone. The
file is written again after each section, so what was measured survives a run cut short.

    python -m bench.gpu_check MODULE:FUNCTION PARAMS_JSON RESULT_PATH   # one section (what the run starts)
"""

import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from bench.gpu_plan import Plan, cpu_plan, gpu_plan

REPO = Path(__file__).resolve().parents[1]
ENVIRONMENT_BUDGET_S = 60.0
MIN_SECTION_BUDGET_S = 20.0  # a section is not started on less of the run's total budget than this
STOP_GRACE_S = 15.0  # from SIGTERM to SIGKILL for a section past its budget (and the stack it started)
LOG_TAIL_CHARS = 4000


def environment() -> dict:
    """The device and the software that measure (run in a process of its own, like a section, so
    that the run itself never holds GPU memory)."""
    import importlib.metadata
    import platform

    import torch

    cuda = torch.cuda.is_available()
    found = {"cuda_available": cuda, "device": torch.cuda.get_device_name(0) if cuda else "cpu (no CUDA device)",
             "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}
    try:
        found["triton"] = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        found["triton"] = None
    if cuda:
        properties = torch.cuda.get_device_properties(0)
        found |= {"multiprocessors": properties.multi_processor_count, "memory_bytes": properties.total_memory,
                  "capability": f"{properties.major}.{properties.minor}"}
    return found


def run_section(target: str, params: dict, budget_s: float, env: dict | None = None) -> dict:
    """`target` ("module:function") called with `params` in a fresh Python, stopped past
    `budget_s`: {"status": "ok", "figures": ...}, or {"status": "error", "error": ...} with the
    exception's "traceback" or, where the process died or was stopped, its output's "log_tail"."""
    with tempfile.TemporaryDirectory(prefix="k25-bench-gpu-") as folder:
        result_path, log_path = os.path.join(folder, "result.json"), os.path.join(folder, "log")
        argv = [sys.executable, "-m", "bench.gpu_check", target, json.dumps(params), result_path]
        with open(log_path, "w") as log:  # a file, not a pipe nobody reads
            # a session of its own: past its budget, it and whatever it started (`k25 up`, ...) stop together
            child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=os.environ | (env or {}),
                                     start_new_session=True)
        try:
            child.wait(budget_s)
        except subprocess.TimeoutExpired:
            _stop_session(child)
            return {"status": "error", "error": f"ran past its budget of {budget_s:.0f} s", "log_tail": _tail(log_path)}
        if os.path.exists(result_path):
            with open(result_path) as f:
                return json.load(f)
        return {"status": "error", "error": f"its process exited with {child.returncode} before recording a result",
                "log_tail": _tail(log_path)}


def _stop_session(child: subprocess.Popen) -> None:
    os.killpg(child.pid, signal.SIGTERM)  # `k25 up` stops its parts on SIGTERM as on Ctrl-C
    try:
        child.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def _tail(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()[-LOG_TAIL_CHARS:]


def git_commit() -> str | None:
    """HEAD of the checkout this code runs from, "+dirty" when tracked files differ from it; None
    where it is no git checkout (a copy of the tree)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def _write(path: str, report: dict) -> None:
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")


def run_check(out: str, allow_cpu: bool, quick: bool, model: str | None, vllm_missing: str | None,
              commit: str | None, progress=print) -> dict:
    """The whole run, its report written to `out` after each section; returns the report."""
    started = time.monotonic()
    progress("looking at the device")
    found = run_section("bench.gpu_check:environment", {}, ENVIRONMENT_BUDGET_S)
    if found["status"] != "ok":
        raise RuntimeError(f"could not look at the device: {found['error']}\n{found.get('log_tail', '')}")
    cuda = found["figures"]["cuda_available"]
    report = {**found["figures"], "git_commit": commit or git_commit(), "quick": quick,
              "sizes": "gpu" if cuda else "cpu (reduced: no figure is a GPU's)", "section_wall_s": {}, "sections": {}}
    plan: Plan = gpu_plan(quick, model, vllm_missing) if cuda else cpu_plan()
    if not cuda and not allow_cpu:
        progress("no CUDA device is present: nothing measured (--allow-cpu runs each section on the CPU in a reduced size)")
        report["sections"] = {s.name: {"status": "skipped", "reason": "no CUDA device (run with --allow-cpu to exercise "
                                       "the sections on the CPU)"} for s in plan.sections}
        _write(out, report)
        return report
    if not cuda:
        progress("no CUDA device is present: running each section on the CPU in a reduced size (--allow-cpu)")
    deadline = started + plan.total_budget_s
    for section in plan.sections:
        budget = min(section.budget_s, deadline - time.monotonic())
        if section.skipped or budget < MIN_SECTION_BUDGET_S:
            reason = section.skipped or f"the run's total budget of {plan.total_budget_s:.0f} s is spent"
            report["sections"][section.name] = {"status": "skipped", "reason": reason}
            progress(f"{section.name}: skipped: {reason}")
            continue
        progress(f"{section.name}: running (budget {budget:.0f} s)")
        section_started = time.monotonic()
        report["sections"][section.name] = result = run_section(section.target, section.params, budget, section.env)
        report["section_wall_s"][section.name] = round(time.monotonic() - section_started, 1)
        progress(f"{section.name}: {result['status']} in {report['section_wall_s'][section.name]} s"
                 + (f": {result['error']}" if result["status"] == "error" else ""))
        _write(out, report)
    report["serve_output_tokens_per_s_k25_over_vllm"] = _serve_ratio(report["sections"])
    _write(out, report)
    return report


def _serve_ratio(sections: dict) -> float | None:
    k25, vllm = sections.get("serve_k25", {}), sections.get("serve_vllm", {})
    if k25.get("status") != "ok" or vllm.get("status") != "ok":
        return None
    return k25["figures"]["output_tokens_per_s"] / vllm["figures"]["output_tokens_per_s"]


def _section_main(target: str, params_json: str, result_path: str) -> None:
    module, _, function = target.partition(":")
    try:
        figures = getattr(importlib.import_module(module), function)(**json.loads(params_json))
        result = {"status": "ok", "figures": figures}
    except Exception as exc:  # any failure is this section's figure: the run goes on
        result = {"status": "error", "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-LOG_TAIL_CHARS:]}
    _write(result_path, result)


if __name__ == "__main__":
    _section_main(*sys.argv[1:])
