"""`k25 engine` as a real subprocess for tests, and a DEALER client that talks to it.

Import the helpers: `from engine_process import EngineProcess, start_engine, ...`."""

import os
import signal
import subprocess
import sys
import time
import uuid
import weakref
from collections import deque
from dataclasses import dataclass

import redis
import zmq

from common.padding import pad_to_chunk_size
from common.redis_keys import live_engines
from common.zmq_curve import ENV as CURVE_ENV
from common.zmq_curve import make_client, new_secret_key
from proto import k25_pb2
from tests.helpers.redis_server import free_port

K25 = [sys.executable, "-m", "k25.cli"]
RELEASE = "test"

# the CURVE key of the stacks and engines that tests also reach with raw DEALERs
# (start_stack(env=STACK_CURVE_ENV), start_engine(env=STACK_CURVE_ENV), dealer(address, STACK_CURVE_KEY))
STACK_CURVE_KEY = new_secret_key()
STACK_CURVE_ENV = {CURVE_ENV: STACK_CURVE_KEY}


@dataclass
class EngineProcess:
    process: subprocess.Popen
    engine_id: str
    zmq_port: int
    metrics_port: int
    redis: redis.Redis
    log_path: str

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.zmq_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def registry_entry(self) -> dict | None:
        return live_engines(self.redis, RELEASE).get(self.engine_id)

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def stop(self, timeout_s: float = 30) -> int:
        return stop_process(self.process, signal.SIGTERM, timeout_s)


def stop_process(process: subprocess.Popen, sig: int, timeout_s: float) -> int:
    """Send `sig` and wait for the exit code; a process still running after `timeout_s` is
    killed and the wait's TimeoutExpired raised, so a test never leaves it behind."""
    if process.poll() is None:
        process.send_signal(sig)
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise


def start_engine(redis_url: str, log_path: str, *flags: str, engine_id: str = "e1", timeout_s: float = 120,
                 env: dict | None = None, python: str = sys.executable) -> EngineProcess:
    """Start `k25 engine` and return once its heartbeat is in Redis (it serves by then).
    It computes in float32 unless `flags` set --dtype: tests compare its tokens with those of
    an in-process engine, whose EngineConfig defaults to float32. `env` is added to its
    environment (e.g. the CURVE key of a stack it joins); `python` runs it (the vLLM backend's
    is tests.helpers.paths.VLLM_PYTHON)."""
    if "--dtype" not in flags:
        flags = ("--dtype", "float32", *flags)
    zmq_port, metrics_port = free_port(), free_port()
    log = open(log_path, "w")  # a file, not a pipe: a pipe nobody reads would block the engine's logging
    process = subprocess.Popen(
        [
            str(python), "-m", "k25.cli", "engine", "--zmq-port", str(zmq_port), "--metrics-port", str(metrics_port),
            "--redis-url", redis_url, "--release", RELEASE, "--engine-id", engine_id, *flags,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=os.environ | {"PYTHONWARNINGS": "ignore"} | (env or {}),
    )
    log.close()
    handle = EngineProcess(process, engine_id, zmq_port, metrics_port, redis.Redis.from_url(redis_url), log_path)
    deadline = time.monotonic() + timeout_s
    while handle.registry_entry() is None:
        if process.poll() is not None or time.monotonic() > deadline:
            handle.stop()
            raise RuntimeError(f"k25 engine did not come up:\n{handle.log()}")
        time.sleep(0.05)
    return handle


def dealer(address: str, curve_secret_key: str | None = None, immediate: bool = False) -> zmq.Socket:
    """A DEALER connected to an engine; with the key of an engine that asks for one (CURVE); with
    `immediate`, set like the gateway's (ZMQ_IMMEDIATE: libzmq drops what it has received but not
    handed over yet when the connection closes)."""
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SNDTIMEO, 10_000)
    socket.setsockopt(zmq.IMMEDIATE, int(immediate))
    if curve_secret_key:
        make_client(socket, curve_secret_key.encode())
    socket.connect(address)
    return socket


def generate_message(
    prompt_token_ids: list[int], chunk_size: int, pad_token_id: int = 0, request_id: str | None = None, **sampling
) -> k25_pb2.ClientMessage:
    padded, pad_length = pad_to_chunk_size(prompt_token_ids, chunk_size, pad_token_id)
    return k25_pb2.ClientMessage(
        generate=k25_pb2.GenerateRequest(
            request_id=request_id or uuid.uuid4().hex,
            tenant="tests",
            model="tiny-random",
            prompt_token_ids=padded,
            pad_length=pad_length,
            chunk_size=chunk_size,
            sampling=k25_pb2.SamplingParams(**sampling),
        )
    )


def send(socket: zmq.Socket, message: k25_pb2.ClientMessage) -> None:
    socket.send(message.SerializeToString())


# messages of a frame that `receive` has read but not yet returned, per socket
_unread: "weakref.WeakKeyDictionary[zmq.Socket, deque[k25_pb2.EngineMessage]]" = weakref.WeakKeyDictionary()


def receive_batch(socket: zmq.Socket, timeout_s: float = 60) -> list[k25_pb2.EngineMessage]:
    """The messages of the engine's next frame (one EngineBatch), in order."""
    assert not _unread.get(socket), "receive() left messages of an earlier frame unread on this socket"
    if not socket.poll(int(timeout_s * 1000), zmq.POLLIN):
        raise TimeoutError(f"no frame from the engine within {timeout_s} s")
    return list(k25_pb2.EngineBatch.FromString(socket.recv()).messages)


def receive(socket: zmq.Socket, timeout_s: float = 60) -> k25_pb2.EngineMessage:
    """The engine's next message, whatever frame it came in; the rest of its frame waits for the next call."""
    unread = _unread.setdefault(socket, deque())
    while not unread:
        unread.extend(receive_batch(socket, timeout_s))
    return unread.popleft()


def request_id_of(message: k25_pb2.EngineMessage) -> str:
    return getattr(message, message.WhichOneof("kind")).request_id


def receive_until_done(socket: zmq.Socket, request_id: str, timeout_s: float = 60) -> list[k25_pb2.EngineMessage]:
    """This request's messages up to and including its Final or Error; others are dropped."""
    messages = []
    while True:
        message = receive(socket, timeout_s)
        if request_id_of(message) != request_id:
            continue
        messages.append(message)
        if message.WhichOneof("kind") in ("final", "error"):
            return messages


def wait_until(condition, timeout_s: float = 15, interval_s: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not met within {timeout_s} s")
        time.sleep(interval_s)
