"""Quantised weights through the engine: `k25 engine --quant`, the EngineConfig field, the
model's weight accounting, and the refusals on the way (as the user sees them)."""

import os
import subprocess
import sys

import pytest
import torch

from common.quant_spec import parse_quant_spec
from engine.base.config import EngineConfig
from engine.base.errors import EngineConfigError
from engine.core.sampling_params import SamplingParams
from engine.llm_engine import LLMEngine
from engine.model.llama import LlamaModel
from engine.offline import generate
from engine.quant.int4_weight import Int4Weight
from engine.quant.int8_weight import Int8Weight
from k25.cli import build_parser

BF16 = EngineConfig(dtype="bfloat16", chunk_size=64)


def test_the_flag_is_read_by_every_command_that_runs_an_engine():
    for command in (["engine"], ["generate", "hi"], ["bench", "engine"]):
        assert build_parser().parse_args(command).quant is None
        assert build_parser().parse_args([*command, "--quant", "small,head=int8"]).quant == "small,head=int8"


def test_a_quantised_engine_builds_each_layer_types_kind_and_generates(tiny_model):
    engine = LLMEngine(tiny_model, EngineConfig(dtype="bfloat16", chunk_size=64, quant="attn=int8,mlp=int4:g32,head=int4:g64"))
    layer = engine.runner.model.layers[0]
    assert isinstance(layer.qkv, Int8Weight) and isinstance(layer.o, Int8Weight)
    assert isinstance(layer.gate_up, Int4Weight) and layer.gate_up.group == 32 and isinstance(engine.runner.model.lm_head, Int4Weight)
    out = generate(engine, [[1000 + i for i in range(40)]], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    assert len(out.token_ids) == 8
    assert engine.runner.model.weight_bytes < LLMEngine(tiny_model, BF16).runner.model.weight_bytes


def test_an_untied_quantised_head_keeps_its_bf16_rows_for_the_best_logits(tiny_model):
    """tiny-random's head is its own matrix: quantised, its bf16 rows stay (logits() computes the
    best logits of a row again from them), in place of the packed bf16 copy."""
    plain = LlamaModel(tiny_model.config, tiny_model.weights, "cpu", torch.bfloat16)
    quantised = LlamaModel(tiny_model.config, tiny_model.weights, "cpu", torch.bfloat16, quant=parse_quant_spec("head=int8"))
    head = tiny_model.weights["lm_head.weight"]
    assert torch.equal(quantised.head_rows, head.bfloat16())
    assert plain.weight_bytes - quantised.weight_bytes == plain.lm_head.read_bytes - quantised.lm_head.nbytes


@pytest.mark.parametrize("config, fragment", [
    (EngineConfig(dtype="bfloat16", quant="mlp=int6"), "--quant: mlp=int6: width 'int6' has no fast kernel here"),
    (EngineConfig(dtype="float32", quant="small"), "use --dtype bfloat16 or auto, not float32"),
    (EngineConfig(dtype="bfloat16", quant="mlp=int4:g128"), "group size 128 does not divide gate_up's input dim 64"),
])
def test_the_engine_refuses_a_spec_it_cannot_run(tiny_model, config, fragment):
    with pytest.raises(EngineConfigError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        LLMEngine(tiny_model, config)


def k25(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "k25.cli", *args], capture_output=True, text=True, timeout=300,
                          env=os.environ | {"PYTHONWARNINGS": "ignore"})


@pytest.mark.slow  # each starts a Python process that loads a model
def test_k25_generate_runs_quantised_and_auto_picks_bfloat16():
    result = k25("generate", "--model", "tiny-random", "--quant", "small", "--max-tokens", "4", "--chat", "hello")
    assert result.returncode == 0, result.stderr
    assert "dtype bfloat16 (auto with --quant" in result.stderr
    assert "weights embed=bf16,attn=int4:g32,mlp=int4:g32,head=int4:g32" in result.stderr


@pytest.mark.slow
def test_k25_generate_refuses_a_bad_spec_in_one_line():
    result = k25("generate", "--model", "tiny-random", "--quant", "mlp=int4:g16", "hello")
    assert result.returncode != 0
    assert "the int4 kernel takes group sizes 32, 64, 128, 256, not 16" in result.stderr
    assert "Traceback" not in result.stderr
