"""A private `redis-server` per test: started on a free port, killed afterwards, so that
tests never share state with each other or with the Redis on 6379.

Use it by importing the fixture into a test module: `from redis_server import redis_server`.
"""

import shutil
import socket
import subprocess
import time

import pytest
import redis


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_redis_server(port: int, timeout_s: float = 10.0) -> subprocess.Popen:
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.ping()
            return process
        except redis.ConnectionError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"redis-server did not start on port {port}")
            time.sleep(0.02)
        finally:
            client.close()


def _private_redis_url():
    if shutil.which("redis-server") is None:  # `make test` installs it or stops first: never a silent skip
        pytest.fail("redis-server not found: install the package redis-server (Debian: sudo apt-get install redis-server)")
    port = free_port()
    process = start_redis_server(port)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.kill()
        process.wait()


@pytest.fixture
def redis_server():
    """The URL of a fresh, empty Redis."""
    yield from _private_redis_url()


@pytest.fixture(scope="module")
def module_redis_url():
    """The URL of a Redis shared by one test module (for a server process started once per module)."""
    yield from _private_redis_url()


@pytest.fixture
def redis_client(redis_server):
    client = redis.Redis.from_url(redis_server)
    try:
        yield client
    finally:
        client.close()
