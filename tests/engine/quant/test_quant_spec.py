"""The quant spec (common/quant_spec.py) and whether it runs on a model and device
(engine/quant/check.py): what is accepted, and every refusal with its reason."""

import pytest

from common.quant_spec import (DEFAULT_INT4_GROUP, NO_QUANT, PRESETS, LayerQuant, QuantSpec, QuantSpecError,
                               parse_quant_spec)
from engine.base.errors import EngineConfigError
from engine.base.model_config import ModelConfig
from engine.quant.check import check_quant, resolve_dtype

# SmolLM2-135M's shape: hidden 576 (9 heads of 64), MLP 1536, tied head
SMOLLM2_SHAPE = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                            num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5, rope_theta=1e5,
                            max_position_embeddings=8192, tie_word_embeddings=True)


def test_a_layered_spec_reads_back_as_written_and_unnamed_types_stay_bf16():
    spec = parse_quant_spec("attn=int8,mlp=int4:g32")
    assert spec == QuantSpec(attn=LayerQuant("int8"), mlp=LayerQuant("int4", 32))
    assert str(spec) == "embed=bf16,attn=int8,mlp=int4:g32,head=bf16"
    assert parse_quant_spec(str(spec)) == spec and spec.quantized


def test_int4_without_a_group_size_gets_the_default():
    assert parse_quant_spec("mlp=int4").mlp == LayerQuant("int4", DEFAULT_INT4_GROUP)


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_parses_to_its_own_spec(name):
    assert str(parse_quant_spec(name)) == str(parse_quant_spec(PRESETS[name].spec))


def test_a_preset_can_be_followed_by_overrides():
    spec = parse_quant_spec("small,head=int8")
    assert spec.head == LayerQuant("int8") and spec.mlp == parse_quant_spec("small").mlp
    assert parse_quant_spec("none") == NO_QUANT and not NO_QUANT.quantized


@pytest.mark.parametrize("text, fragment", [
    ("ffn=int4", "unknown layer type 'ffn'; layer types: embed, attn, mlp, head"),
    ("mlp=int6", "width 'int6' has no fast kernel here; widths: bf16, int8, int4"),
    ("attn=fp8", "width 'fp8' has no fast kernel here"),
    ("attn=int8:g64", "a group size applies to int4 only (int8 has one scale per output row)"),
    ("head=bf16:g32", "a group size applies to int4 only (bf16 has no scales)"),
    ("mlp=int4:g16", "the int4 kernel takes group sizes 32, 64, 128, 256, not 16"),
    ("mlp=int4:64", "the group size is written gN"),
    ("embed=int4", "the embedding takes bf16 or int8"),
    ("mlp=int4,mlp=int8", "layer type 'mlp' is set twice"),
    ("attn=int8,,mlp=int4", "empty item"),
    ("", "empty item"),
    ("attn=int8, mlp=int4", "write it without spaces"),
    ("tiny", "unknown quant preset 'tiny'; presets: none, int8, balanced, small"),
    ("attn=int8,small", "write TYPE=WIDTH, e.g. mlp=int4 (a preset may only come first)"),
])
def test_a_spec_that_cannot_be_read_is_refused_naming_the_part(text, fragment):
    with pytest.raises(QuantSpecError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        parse_quant_spec(text)


def test_auto_with_quantised_weights_is_bfloat16_and_a_set_dtype_is_kept():
    small = parse_quant_spec("small")
    assert resolve_dtype("auto", small) == "bfloat16"
    assert resolve_dtype("float32", small) == "float32"  # ... and check_quant refuses it, below
    assert resolve_dtype("auto", NO_QUANT) == "auto"


def test_the_presets_run_on_smollm2_in_bf16_on_a_cpu_and_on_cuda():
    for name in PRESETS:
        for device in ("cpu", "cuda", "cuda:1"):
            check_quant(parse_quant_spec(name), SMOLLM2_SHAPE, device, "bfloat16")
    check_quant(NO_QUANT, SMOLLM2_SHAPE, "cuda", "float16")  # unquantised: nothing to check


@pytest.mark.parametrize("text, device, dtype, fragment", [
    ("small", "cpu", "float32", "use --dtype bfloat16 or auto, not float32"),
    ("attn=int8", "cuda", "float16", "use --dtype bfloat16 or auto, not float16"),
    # 576 (hidden) and 1536 are multiples of 32 and 64, not of 128 or 256
    ("attn=int4:g128", "cpu", "bfloat16", "group size 128 does not divide qkv's input dim 576"),
    ("mlp=int4:g256", "cpu", "bfloat16", "group size 256 does not divide gate_up's input dim 576"),
    ("embed=int8", "cpu", "bfloat16", "an int8 embedding would add a copy, not save one"),
])
def test_a_spec_the_model_or_device_cannot_run_is_refused_with_the_reason(text, device, dtype, fragment):
    with pytest.raises(EngineConfigError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        check_quant(parse_quant_spec(text), SMOLLM2_SHAPE, device, dtype)


def test_int4_needs_output_rows_in_sixteens():
    # q 8 x 36 = 288 (a multiple of 32) plus k and v 1 x 36 each: 360 rows of qkv, not a multiple of 16
    odd = ModelConfig(vocab_size=1000, hidden_size=64, intermediate_size=144, num_layers=1, num_heads=8,
                      num_kv_heads=1, head_dim=36, rms_norm_eps=1e-5, rope_theta=1e4,
                      max_position_embeddings=128, tie_word_embeddings=False)
    with pytest.raises(EngineConfigError, match="qkv has 360 output rows, and the int4 kernel packs them 16 at a time; "
                                                "use int8 for attn"):
        check_quant(parse_quant_spec("attn=int4:g32"), odd, "cpu", "bfloat16")
    check_quant(parse_quant_spec("attn=int4:g32"), odd, "cuda", "bfloat16")  # the Triton kernel masks the edge
    with pytest.raises(EngineConfigError, match="group size 32 does not divide down's input dim 144"):
        check_quant(parse_quant_spec("mlp=int4:g32"), odd, "cpu", "bfloat16")
    # untied: an int8 embedding beside a bf16 head saves memory, and is accepted
    check_quant(parse_quant_spec("attn=int8,mlp=int8,embed=int8"), odd, "cpu", "bfloat16")
