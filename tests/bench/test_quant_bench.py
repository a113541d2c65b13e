"""`k25 bench quant`'s pieces: the recommendation as a pure function, the bytes a decode step
reads by layer type, and the command end to end on the tiny model."""

import json
import subprocess
import sys

import pytest
import torch

from bench.quant_bytes import decode_weight_bytes
from bench.quant_choice import Option, candidates_within
from common.quant_spec import LAYER_TYPES, LayerQuant, parse_quant_spec
from engine.model.llama import REFINED_LOGITS, LlamaModel

BF16, INT8, INT4 = LayerQuant(), LayerQuant("int8"), LayerQuant("int4", 32)
# per layer type: (KL it adds alone, bytes read); bf16 adds nothing
TABLE = {
    "embed": {BF16: (0.0, 2), INT8: (0.002, 1)},
    "attn": {BF16: (0.0, 50), INT8: (0.004, 25), INT4: (0.001, 15)},
    "mlp": {BF16: (0.0, 150), INT8: (0.006, 75), INT4: (0.030, 45)},
    "head": {BF16: (0.0, 60), INT8: (0.001, 30), INT4: (0.024, 18)},
}
OPTIONS = [Option(t, layer, kl, read) for t, widths in TABLE.items() for layer, (kl, read) in widths.items()]


def test_the_cheapest_spec_within_the_budget_comes_first():
    best = candidates_within(OPTIONS, 0.0101)[0]
    # mlp int4 (0.030) and head int4 (0.024) are each over the budget; every other width together adds 0.010
    assert str(best.spec) == "embed=int8,attn=int4:g32,mlp=int8,head=int8"
    assert best.bytes_read == 1 + 15 + 75 + 30 and best.estimated_kl == pytest.approx(0.002 + 0.001 + 0.006 + 0.001)


def test_every_candidate_is_within_the_budget_and_they_come_cheapest_first():
    found = candidates_within(OPTIONS, 0.035)
    assert all(c.estimated_kl <= 0.035 for c in found)
    assert [c.bytes_read for c in found] == sorted(c.bytes_read for c in found)
    assert len(found) < 2 * 3 * 3 * 3  # some combinations are over


def test_a_zero_budget_leaves_only_bf16_and_a_missing_type_is_an_error():
    assert [str(c.spec) for c in candidates_within(OPTIONS, 0.0)] == ["embed=bf16,attn=bf16,mlp=bf16,head=bf16"]
    with pytest.raises(ValueError, match="head"):
        candidates_within([o for o in OPTIONS if o.layer_type != "head"], 1.0)


def test_decode_bytes_are_each_layer_types_weights_once(tiny_model):
    c = tiny_model.config
    bf16 = decode_weight_bytes(LlamaModel(c, tiny_model.weights, "cpu", torch.bfloat16))
    h, q, kv, i = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size
    assert bf16["attn"] == c.num_layers * 2 * (h * (q + 2 * kv) + q * h)
    assert bf16["mlp"] == c.num_layers * 2 * (2 * i * h + h * i)
    assert bf16["head"] == 2 * c.vocab_size * h + REFINED_LOGITS * 2 * h  # the head, and its best rows again
    assert bf16["embed"] == 2 * h  # one row a token
    small = decode_weight_bytes(LlamaModel(c, tiny_model.weights, "cpu", torch.bfloat16, quant=parse_quant_spec("small")))
    # int4 in groups of 32: half a byte a weight, and a bf16 scale and zero a group
    assert small["mlp"] == c.num_layers * (3 * i * h // 2 + 3 * i * h // 32 * 4)
    assert set(small) == set(LAYER_TYPES) | {"norms"} and small["norms"] == bf16["norms"]


@pytest.mark.slow  # runs the engine many times in a subprocess
def test_bench_quant_json_has_the_table_the_presets_and_a_recommendation(tmp_path):
    plot = tmp_path / "quant.png"
    result = subprocess.run(
        [sys.executable, "-m", "k25.cli", "bench", "quant", "--model", "tiny-random", "--tokens-per-text", "16",
         "--batches", "1", "2", "--decode-context", "16", "--decode-steps", "2", "--rounds", "1", "--kl-budget", "10",
         "--plot", str(plot), "--json"],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert {(r["layer_type"], r["width"]) for r in figures["layers"]} >= {("embed", "int8"), ("attn", "int4:g32"), ("head", "int8")}
    assert [s["name"] for s in figures["specs"]] == ["bf16", "int8", "balanced", "small"]
    assert figures["specs"][0]["mean_kl"] == 0 and all(s["tokens_per_s"].keys() == {"1", "2"} for s in figures["specs"])
    assert figures["recommended"]["mean_kl"] <= 10 and plot.stat().st_size > 0
