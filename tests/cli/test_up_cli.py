"""`k25 up`'s refusals: each a clear one-line message and a non-zero exit, nothing started."""

import os
import subprocess
import sys

import pytest

K25_UP = [sys.executable, "-m", "k25.cli", "up", "--model", "tiny-random"]


def run(*flags, env=None):
    return subprocess.run([*K25_UP, *flags], capture_output=True, text=True, timeout=60, env=env)


def test_without_redis_server_it_says_what_to_do():
    done = run(env={**os.environ, "PATH": "/nonexistent"})
    assert done.returncode == 1
    assert "no redis-server on PATH" in done.stderr and "--redis-url" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("flags, message", [
    (["--pool", "short"], "expected NAME=CHUNK_SIZE"),
    (["--pool", "short=0"], "expected NAME=CHUNK_SIZE"),
    (["--engines", "0"], "--engines must be at least 1"),
    (["--engines", "-1", "--autoscale"], "--engines must be at least 1"),
    (["--drain-timeout-s", "-1"], "--drain-timeout-s must not be negative"),
    (["--pool", "a=64", "--pool", "a=128"], "each --pool needs its own name"),
    (["--autoscale", "--engines", "3", "--max-engines", "2"], "--max-engines must be at least --engines"),
])
def test_bad_flags_are_refused(flags, message):
    done = run(*flags)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
