"""What every test of a Triton kernel shares: the device it runs on, the dtypes it can be checked
in there, and the interpreter on a CPU (import `interpret_on_a_cpu` into the test module: it is
an autouse fixture)."""

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# the interpreter's bfloat16 tl.dot is wrong: bfloat16 only on CUDA
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])


@pytest.fixture(autouse=True)
def interpret_on_a_cpu(monkeypatch):
    """Triton reads it when a kernel is decorated (its module's first import) and while it runs."""
    if DEVICE == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
