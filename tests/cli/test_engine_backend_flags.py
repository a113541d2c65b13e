"""`k25 engine --backend`: the flags each backend refuses, and what a user without vLLM is told."""

import subprocess
import sys

import pytest

from k25.cli import build_parser
from k25.commands.engine import invalid_flags
from k25.commands.engine_backend import vllm_python
from tests.helpers.paths import VLLM_PYTHON


@pytest.mark.parametrize("flags, message", [
    (["--tensor-parallel-size", "2"], "--tensor-parallel-size 2: K25's engine runs on one GPU; --backend vllm serves"),
    (["--backend", "k25", "--expert-parallel"], "--expert-parallel: K25's engine serves no mixture of experts"),
    (["--backend", "vllm", "--inject-step-failures-while", "/tmp/x"], "fails K25's engine's forward pass"),
    (["--backend", "vllm", "--tensor-parallel-size", "0"], "--tensor-parallel-size must be at least 1"),
    (["--pipeline-parallel-size", "2"], "--pipeline-parallel-size 2: K25's engine runs on one GPU; --backend vllm serves"),
    (["--nnodes", "2"], "--nnodes 2: K25's engine runs on one GPU; --backend vllm serves a model over several nodes"),
    (["--backend", "vllm", "--tensor-parallel-size", "2", "--nnodes", "4"],
     "--nnodes 4 must divide the engine's 2 ranks (--pipeline-parallel-size x --tensor-parallel-size) evenly"),
    (["--backend", "vllm", "--pipeline-parallel-size", "2", "--nnodes", "2", "--node-rank", "2"],
     "--node-rank must be from 0 to 1 (--nnodes 2), got 2"),
    (["--backend", "vllm", "--node-rank", "-1"], "--node-rank must be from 0 to 0"),
])
def test_each_backend_refuses_what_it_cannot_do(flags, message):
    assert message in invalid_flags(build_parser().parse_args(["engine", *flags]))


@pytest.mark.parametrize("flags", [["--backend", "vllm", "--tensor-parallel-size", "4", "--expert-parallel"],
                                   ["--backend", "vllm", "--inject-fault", "a@v1"], [],
                                   ["--backend", "vllm", "--tensor-parallel-size", "4", "--pipeline-parallel-size", "2",
                                    "--nnodes", "2", "--node-rank", "1", "--master-addr", "big-engine-0.big-engine.s"],
                                   ["--backend", "vllm", "--pipeline-parallel-size", "2"]])  # two stages on one node
def test_what_each_backend_takes(flags):
    assert invalid_flags(build_parser().parse_args(["engine", *flags])) == ""


def test_without_vllm_here_the_engine_says_where_to_get_it():
    """The project's own Python has no vLLM (it lives in .venv-vllm): a clear refusal, exit 2."""
    result = subprocess.run([sys.executable, "-m", "k25.cli", "engine", "--backend", "vllm", "--redis-url", "",
                             "--metrics-port", "0"], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "--backend vllm needs vLLM in this Python" in result.stderr and "make vllm" in result.stderr


def test_k25_up_runs_vllm_engines_with_the_checkouts_vllm_environment():
    assert vllm_python() == str(VLLM_PYTHON)
