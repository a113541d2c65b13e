"""Child processes of `k25 up`: start them, watch them, and stop every one of them.

Each child writes its log to a file in the stack's log folder. On Linux a child is also
told to receive SIGTERM if `k25 up` itself dies, so that not even a SIGKILL of the
parent leaves an orphan.
"""

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

PR_SET_PDEATHSIG = 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    log_path: str
    metrics_url: str = ""  # where an engine serves /metrics
    announced: bool = False  # its address has been printed

    def log_tail(self, lines: int = 15) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""


class ProcessGroup:
    def __init__(self, log_dir: str):
        self.log_dir = log_dir
        self.children: list[Child] = []

    def spawn(self, name: str, argv: list[str], env: dict | None = None) -> Child:
        log_path = os.path.join(self.log_dir, f"{name}.log")
        with open(log_path, "ab") as log_file:
            process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})}, preexec_fn=_die_with_parent,
            )
        child = Child(name, process, log_path)
        self.children.append(child)
        return child

    def first_exited(self) -> Child | None:
        return next((c for c in self.children if c.process.poll() is not None), None)

    def stop(self, child: Child, grace_s: float = 10.0) -> None:
        self.children.remove(child)
        _terminate([child], grace_s)

    def stop_all(self, grace_s: float = 10.0) -> None:
        """SIGTERM to every child (the newest first, so the gateway goes before its engines),
        then SIGKILL to whatever is still running after `grace_s`."""
        children, self.children = list(reversed(self.children)), []
        _terminate(children, grace_s)


def _terminate(children: list[Child], grace_s: float) -> None:
    for child in children:
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for child in children:
        try:
            child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait()
