"""`k25 chunker` as a real process on free ports, for the tests that need one."""

import os
import pathlib
import subprocess
import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from services.chunker.boundaries import ChunkParams
from tests.helpers.engine_process import K25, wait_until
from tests.helpers.redis_server import free_port

MAX_DOCUMENT_BYTES = 60_000  # above the largest contract fixture (50 KB), which the tests send whole
DEFAULTS = ChunkParams(passage_tokens=128, overlap_ratio=0.2, semantic_threshold=0.5)


@dataclass
class ChunkerProcess:
    process: subprocess.Popen
    zmq_port: int
    metrics_port: int
    log_path: pathlib.Path

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.zmq_port}"

    def metrics(self) -> dict[tuple[str, tuple], float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            text = response.read().decode()
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def log(self) -> str:
        return self.log_path.read_text()


def start_chunker(log_path: pathlib.Path, timeout_s: float = 60, zmq_port: int | None = None) -> ChunkerProcess:
    """Start `k25 chunker` (on `zmq_port`, or a free port) and return once its /metrics answers (it
    has bound its ZMQ port by then)."""
    zmq_port, metrics_port = zmq_port or free_port(), free_port()
    with open(log_path, "w") as log:  # a file, not a pipe that nobody reads
        process = subprocess.Popen(
            [
                *K25, "chunker", "--zmq-port", str(zmq_port), "--metrics-port", str(metrics_port),
                "--max-document-bytes", str(MAX_DOCUMENT_BYTES), "--chunk-size", str(DEFAULTS.passage_tokens),
                "--overlap-ratio", str(DEFAULTS.overlap_ratio), "--semantic-threshold", str(DEFAULTS.semantic_threshold),
            ],
            stdout=log, stderr=subprocess.STDOUT, env=os.environ | {"PYTHONWARNINGS": "ignore"},
        )
    handle = ChunkerProcess(process, zmq_port, metrics_port, log_path)

    def serving() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"k25 chunker exited:\n{handle.log()}")
        try:
            return bool(handle.metrics())
        except OSError:
            return False

    wait_until(serving, timeout_s, what="k25 chunker serving /metrics")
    return handle
