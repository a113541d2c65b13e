"""`k25 gateway` and `k25 up` as real subprocesses for tests.

Import the helpers: `from gateway_process import start_gateway, start_stack, ...`."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from tests.helpers.engine_process import RELEASE, stop_process
from tests.helpers.redis_server import free_port

K25 = [sys.executable, "-m", "k25.cli"]
ENV = os.environ | {"PYTHONWARNINGS": "ignore"}


@dataclass
class ServiceProcess:
    process: subprocess.Popen
    port: int
    log_path: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30) -> int:
        return stop_process(self.process, sig, timeout_s)


def http_json(url: str, body: dict | None = None, headers: dict | None = None, timeout_s: float = 60):
    """(status, headers with lower-case names, parsed JSON body) of a GET, or of a POST when
    `body` is given."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, _lower(response.headers), json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, _lower(exc.headers), json.loads(exc.read() or b"null")


def _lower(headers) -> dict:
    return {name.lower(): value for name, value in headers.items()}


def _wait_ready(service: ServiceProcess, timeout_s: float) -> ServiceProcess:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if http_json(f"{service.url}/readyz", timeout_s=2)[0] == 200:
                return service
        except OSError:
            pass
        if service.process.poll() is not None or time.monotonic() > deadline:
            service.stop(signal.SIGKILL)
            raise RuntimeError(f"{service.process.args[3]} did not become ready:\n{service.log()}")
        time.sleep(0.1)


def _spawn(argv: list[str], port: int, log_path: str, env: dict | None = None) -> ServiceProcess:
    with open(log_path, "w") as log:  # a file, not a pipe nobody reads
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=ENV | (env or {}))
    return ServiceProcess(process, port, log_path)


def start_gateway(redis_url: str, log_path: str, *flags: str, model: str = "tiny-random", timeout_s: float = 60) -> ServiceProcess:
    """Start `k25 gateway` and return once /readyz says it is ready. It is ready without
    engines: start those it must see first (its first registry read comes before it is ready)."""
    port = free_port()
    argv = [*K25, "gateway", "--port", str(port), "--model", model, "--redis-url", redis_url, "--release", RELEASE, *flags]
    return _wait_ready(_spawn(argv, port, log_path), timeout_s)


# `k25 up` flags per engine backend, for suites that run on both (vLLM's from `make vllm`, eager:
# it starts in seconds)
BACKEND_FLAGS = {"k25": (), "vllm": ("--backend", "vllm", "--engine-flag=--enforce-eager")}


def start_stack(log_path: str, *flags: str, env: dict | None = None, timeout_s: float = 240) -> ServiceProcess:
    """Start `k25 up` (its own Redis unless --redis-url is among the flags) and return once
    its gateway is ready; `env` is added to the environment of every process of the stack.
    Its engines compute in float32 unless `flags` set their --dtype: tests compare what they
    serve with in-process engines, whose EngineConfig defaults to float32."""
    port = free_port()
    if not any(flag.startswith("--engine-flag=--dtype") for flag in flags):
        flags = ("--engine-flag=--dtype=float32", *flags)
    argv = [*K25, "up", "--port", str(port), *flags]
    return _wait_ready(_spawn(argv, port, log_path, env), timeout_s)


def start_replica(pid: int, log_path: str, timeout_s: float = 60) -> ServiceProcess:
    """A second replica of the service process `pid` (e.g. a stack's gateway): its command line
    and environment (its keys among them), listening on a free --port; returns once it is ready."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = [part.decode() for part in f.read().split(b"\0")[:-1]]
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(item.decode().split("=", 1) for item in f.read().split(b"\0") if b"=" in item)
    port = free_port()
    argv[argv.index("--port") + 1] = str(port)
    return _wait_ready(_spawn(argv, port, log_path, env), timeout_s)


def children_of(pid: int) -> dict[int, str]:
    """pid -> command line of every live process whose parent is `pid`."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            if parent != pid:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                found[int(entry)] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ValueError, IndexError):
            continue
    return found


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")
