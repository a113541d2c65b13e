"""The `k25` command line, run as a real subprocess."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # each test starts Python processes that load a model

from engine.base.config import EngineConfig
from engine.core.sampling_params import SamplingParams
from engine.llm_engine import LLMEngine
from engine.offline import generate

K25 = [sys.executable, "-m", "k25.cli"]


def k25(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*K25, *args], capture_output=True, text=True, timeout=300, env=os.environ | {"PYTHONWARNINGS": "ignore"})


def expected_text(model, prompt_ids, **sampling) -> str:
    engine = LLMEngine(model, EngineConfig(chunk_size=256))
    return generate(engine, [prompt_ids], SamplingParams(**sampling))[0].text


def test_generate_prints_only_the_generated_text(tiny_model):
    # float32 as the in-process reference computes (auto measures, and on a tie keeps float32 too)
    result = k25("generate", "--model", "tiny-random", "--dtype", "float32", "--max-tokens", "12", "The contract says")
    assert result.returncode == 0, result.stderr
    prompt = tiny_model.tokenizer.encode("The contract says")
    assert result.stdout == expected_text(tiny_model, prompt, max_tokens=12) + "\n"


def test_generate_chat_applies_the_template_and_seed_reproduces(tiny_model):
    args = ["generate", "--model", "tiny-random", "--dtype", "float32", "--chat", "--max-tokens", "10", "--temperature", "0.9",
            "--seed", "5", "Hi"]
    first, second = k25(*args), k25(*args)
    assert first.returncode == 0 and first.stdout == second.stdout
    tokenizer = tiny_model.tokenizer
    prompt = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}]))
    assert first.stdout == expected_text(tiny_model, prompt, max_tokens=10, temperature=0.9, seed=5) + "\n"


@pytest.mark.parametrize(
    "args, fragment, code",
    [
        (["--model", "/nonexistent/model.gguf"], "/nonexistent/model.gguf", 2),
        (["--model", "tiny-random", "--temperature", "-1"], "temperature", 1),
        (["--model", "tiny-random", "--max-tokens", "100000"], "exceeds", 1),
    ],
)
def test_generate_errors_are_one_clear_line(args, fragment, code):
    result = k25("generate", *args, "hello")
    assert result.returncode == code
    assert fragment in result.stderr and "Traceback" not in result.stderr


def test_help_lists_commands():
    result = k25("--help")
    assert result.returncode == 0 and "generate" in result.stdout and "bench" in result.stdout
