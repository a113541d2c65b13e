"""`k25 bench gpu`, sections serve_k25 and serve_vllm: `k25 up --backend BACKEND` on a free port,
one `k25 bench serve` workload through its gateway, then the stack stopped as Ctrl-C stops it.
Both are the commands a user runs, as child processes, so the figures are the ones those print."""

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

from common.ports import free_port

K25 = [sys.executable, "-m", "k25.cli"]
STOP_TIMEOUT_S = 60.0  # `k25 up` drains its engines (none has a request left by then), then stops the rest
LOG_TAIL_CHARS = 3000


def _tail(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()[-LOG_TAIL_CHARS:]


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _stop(stack: subprocess.Popen) -> None:
    if stack.poll() is None:
        stack.send_signal(signal.SIGINT)
        try:
            stack.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            stack.kill()  # its parts die with it (k25/local_stack.py)
            stack.wait()


def serve_backend(backend: str, model: str, engine_flags: list[str], serve_flags: list[str], startup_timeout_s: float) -> dict:
    """`k25 up --backend BACKEND --model MODEL` with each of `engine_flags` as an --engine-flag, then
    `k25 bench serve --json` with `serve_flags` against it: its report, and what it ran."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_dir = tempfile.mkdtemp(prefix=f"k25-bench-gpu-{backend}-")
    up = [*K25, "up", "--backend", backend, "--model", model, "--port", str(port), "--log-dir", log_dir,
          *(f"--engine-flag={flag}" for flag in engine_flags)]
    up_log = os.path.join(log_dir, "up.log")
    with open(up_log, "w") as log:  # a file, not a pipe nobody reads
        stack = subprocess.Popen(up, stdout=log, stderr=subprocess.STDOUT)
    try:
        started = time.monotonic()
        while not _ready(url):
            if stack.poll() is not None or time.monotonic() - started > startup_timeout_s:
                raise RuntimeError(f"`k25 up --backend {backend}` did not become ready (logs in {log_dir}); "
                                   f"its log ends with:\n{_tail(up_log)}")
            time.sleep(0.5)
        startup_s = time.monotonic() - started
        serve = [*K25, "bench", "serve", "--url", url, *serve_flags, "--json"]
        done = subprocess.run(serve, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"`k25 bench serve` exited with {done.returncode} (stack logs in {log_dir}): "
                               f"{done.stderr[-LOG_TAIL_CHARS:]}")
        report = json.loads(done.stdout.splitlines()[-1])
    finally:
        _stop(stack)
    shutil.rmtree(log_dir)  # kept where the stack failed
    return {"backend": backend, "model": model, "up": shlex.join(["k25", *up[3:]]), "serve": shlex.join(["k25", *serve[3:]]),
            "startup_s": startup_s, "output_tokens_per_s": report["output_tokens_per_s"], "completed": report["completed"],
            "failed": report["failed"], "report": report}
