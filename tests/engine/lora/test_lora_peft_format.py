"""Reading PEFT's files: what is served, and every PEFT feature that is refused rather than ignored.
The adapters are written by peft; the broken ones are peft's files edited."""

import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.base.errors import EngineError, ErrorCode
from engine.lora.peft_format import UNSUPPORTED_OPTIONS, parse_peft_adapter
from engine.lora.source import read_adapter_files
from engine.model.loader import load_model
from tests.helpers.lora_helpers import attach_random_adapters, save_tiny_llama_with_adapters

SPECS = {"code": dict(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "down_proj"])}
MAX_RANK = 16


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model):
    base = tmp_path_factory.mktemp("peft-format")
    save_tiny_llama_with_adapters(base / "model", base / "root", tiny_model.tokenizer, SPECS)
    return load_model(str(base / "model")), base


@pytest.fixture
def copy_of_adapter(world, tmp_path):
    _, base = world
    shutil.copytree(base / "root" / "code", tmp_path / "code")
    return tmp_path / "code"


def parse(world, folder, max_rank=MAX_RANK):
    model, _ = world
    return parse_peft_adapter(read_adapter_files(str(folder.parent), folder.name), model.config, max_rank)


def edit_config(folder, **changes) -> None:
    path = folder / "adapter_config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is ...:
            config.pop(key)
        else:
            config[key] = value
    path.write_text(json.dumps(config))


def invalid(world, folder, max_rank=MAX_RANK) -> str:
    with pytest.raises(EngineError) as caught:
        parse(world, folder, max_rank)
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT
    return caught.value.message


def test_peft_files_give_every_module_of_every_layer_and_the_scaling(world):
    model, base = world
    weights = parse(world, base / "root" / "code")
    saved = load_file(base / "root" / "code" / "adapter_model.safetensors")
    assert weights.rank == 8 and weights.scaling == 16 / 8
    assert sorted(weights.matrices) == [(layer, m) for layer in range(model.config.num_layers) for m in ("down_proj", "k_proj", "q_proj")]
    a, b = weights.matrices[(1, "k_proj")]
    assert torch.equal(a, saved["base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight"])
    assert torch.equal(b, saved["base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight"])


def test_rslora_scales_by_the_square_root_of_the_rank(world, copy_of_adapter):
    edit_config(copy_of_adapter, use_rslora=True)
    assert parse(world, copy_of_adapter).scaling == 16 / math.sqrt(8)


def test_a_missing_lora_alpha_means_peft_s_default_of_8(world, copy_of_adapter):
    edit_config(copy_of_adapter, lora_alpha=...)
    assert parse(world, copy_of_adapter).scaling == 8 / 8


@pytest.mark.parametrize(
    "option, value, said",
    [(option, True, what) for option, what in UNSUPPORTED_OPTIONS.items()]
    + [
        ("modules_to_save", ["lm_head"], "modules_to_save"),
        ("rank_pattern", {"q_proj": 4}, "rank_pattern"),
        ("bias", "all", "bias='all'"),
        ("peft_type", "IA3", "peft_type 'IA3'"),
        ("r", 0, "r must be a positive integer"),
        ("lora_alpha", "high", "lora_alpha must be a number"),
    ],
)
def test_options_that_change_the_computation_are_refused_by_name(world, copy_of_adapter, option, value, said):
    edit_config(copy_of_adapter, **{option: value})
    assert said in invalid(world, copy_of_adapter)


def test_a_rank_above_max_lora_rank_is_refused(world, copy_of_adapter):
    assert "max_lora_rank 4" in invalid(world, copy_of_adapter, max_rank=4)


def test_an_adapter_for_another_model_is_refused(world, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    model, _ = world
    c = model.config
    for name, changes in {"wider": dict(hidden_size=c.hidden_size * 2), "deeper": dict(num_hidden_layers=c.num_layers + 1)}.items():
        settings = dict(
            vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size, num_hidden_layers=c.num_layers,
            num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim,
        ) | changes
        attach_random_adapters(LlamaForCausalLM(LlamaConfig(**settings)), {name: SPECS["code"]}).save_pretrained(tmp_path)
        message = invalid(world, tmp_path / name)
        assert ("another model" in message) if name == "wider" else (f"layer {c.num_layers}" in message)


def test_lora_on_the_embeddings_is_refused(world, tmp_path):
    from transformers import LlamaForCausalLM

    _, base = world
    hf_model = LlamaForCausalLM.from_pretrained(base / "model")
    attach_random_adapters(hf_model, {"embed": dict(r=4, target_modules=["embed_tokens", "q_proj"])}).save_pretrained(tmp_path)
    assert "embed_tokens" in invalid(world, tmp_path / "embed")


def test_an_a_without_its_b_is_refused(world, copy_of_adapter):
    path = copy_of_adapter / "adapter_model.safetensors"
    tensors = load_file(path)
    del tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
    save_file(tensors, path)
    assert "q_proj has lora_A but not both" in invalid(world, copy_of_adapter)


def test_files_that_are_not_json_or_safetensors_or_hold_nothing_are_refused(world, copy_of_adapter):
    weights = copy_of_adapter / "adapter_model.safetensors"
    save_file({}, weights)
    assert "holds no LoRA matrices" in invalid(world, copy_of_adapter)
    weights.write_bytes(b"\x00" * 64)
    assert "not a safetensors file" in invalid(world, copy_of_adapter)
    (copy_of_adapter / "adapter_config.json").write_text("[8]")
    assert "not a JSON object" in invalid(world, copy_of_adapter)
    (copy_of_adapter / "adapter_config.json").write_text("{r: 8")
    assert "not JSON" in invalid(world, copy_of_adapter)
