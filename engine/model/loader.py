"""Loading a Llama-family model: its config, fp32 weights in Hugging Face naming, and its tokenizer.

Sources (see common.model_source): a GGUF file (dequantised here), a Hugging Face folder
(config.json + safetensors), or `tiny-random`, a small seeded model for control-plane tests.
Whatever the source, the weights pass the same checks against the config before use.
"""

import glob
import json
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from safetensors import SafetensorError, safe_open

from common.gguf_file import GGUFError, GGUFFile
from common.model_source import DEFAULT_MODEL, ModelLoadError, ModelSource, resolve_model
from common.tokenizer import Tokenizer
from engine.base.model_config import ModelConfig
from engine.model.gguf_dequant import SUPPORTED_TYPES, dequantize, is_supported


@dataclass
class LoadedModel:
    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: Tokenizer
    source: str  # the GGUF file or HF folder loaded; "tiny-random" for the tiny model


TINY_CONFIG = ModelConfig(
    vocab_size=49152,  # SmolLM2's tokenizer
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=8192,
    tie_word_embeddings=False,
)


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every weight a model of this config must have, in Hugging Face naming, with its shape."""
    h, ffn = config.hidden_size, config.intermediate_size
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    shapes = {"model.embed_tokens.weight": (config.vocab_size, h)}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate_proj.weight": (ffn, h),
            p + "mlp.up_proj.weight": (ffn, h),
            p + "mlp.down_proj.weight": (h, ffn),
        }
    shapes["model.norm.weight"] = (h,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    return shapes


def optional_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Weights some Llama-family models add (Qwen2's q/k/v biases, attention_bias=True's o bias)."""
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    shapes = {}
    for i in range(config.num_layers):
        p = f"model.layers.{i}.self_attn."
        shapes |= {p + "q_proj.bias": (q,), p + "k_proj.bias": (kv,), p + "v_proj.bias": (kv,)}
        shapes[p + "o_proj.bias"] = (config.hidden_size,)
    return shapes


def check_weights(config: ModelConfig, weights: dict[str, torch.Tensor], where: str, dtype: torch.dtype = torch.float32) -> None:
    """Raise ModelLoadError unless `weights` are exactly the config's tensors, in `dtype` and finite."""
    expected, optional = expected_shapes(config), optional_shapes(config)
    missing = sorted(expected.keys() - weights.keys())
    unexpected = sorted(weights.keys() - expected.keys() - optional.keys())
    if missing or unexpected:
        raise ModelLoadError(
            f"{where}: weights do not match the config: missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}"
        )
    for name, tensor in weights.items():
        want = expected.get(name) or optional[name]
        if tuple(tensor.shape) != want:
            raise ModelLoadError(f"{where}: {name} has shape {tuple(tensor.shape)}, the config implies {want}")
        if tensor.dtype != dtype:
            raise ModelLoadError(f"{where}: {name} is {tensor.dtype}, expected {dtype}")
        if not torch.isfinite(tensor).all():
            raise ModelLoadError(f"{where}: {name} holds NaN or infinite values")


def load_model(name_or_path: str = DEFAULT_MODEL, dtype: torch.dtype = torch.float32) -> LoadedModel:
    """The model's config, tokenizer and weights in `dtype`: each tensor is converted as it is
    read or dequantised, so no full-precision copy of the whole model is ever held."""
    source = resolve_model(name_or_path)
    where = "tiny-random" if source.kind == "tiny" else source.path
    with _threads_for_size(_disk_size(source)):
        try:
            config, weights, tokenizer = _load(source, dtype)
        except GGUFError as e:
            raise ModelLoadError(str(e)) from None
        except OSError as e:
            raise ModelLoadError(f"{e.filename or where}: {e.strerror or e}") from None
        except SafetensorError as e:
            raise ModelLoadError(f"{where}: unreadable safetensors ({e})") from None
        check_weights(config, weights, where, dtype)
    if tokenizer.vocab_size > config.vocab_size:
        raise ModelLoadError(
            f"{where}: the tokenizer has {tokenizer.vocab_size} tokens, the model only {config.vocab_size}"
        )
    return LoadedModel(config, weights, tokenizer, where)


def model_config(name_or_path: str = DEFAULT_MODEL) -> ModelConfig:
    """The model's shape alone, without reading its weights."""
    source = resolve_model(name_or_path)
    try:
        if source.kind == "gguf":
            with GGUFFile(source.path) as gguf:
                return _gguf_config(gguf)
        if source.kind == "hf":
            return _hf_config(source.path)
    except GGUFError as e:
        raise ModelLoadError(str(e)) from None
    except OSError as e:
        raise ModelLoadError(f"{e.filename or source.path}: {e.strerror or e}") from None
    return TINY_CONFIG


def _load(source: ModelSource, dtype: torch.dtype) -> tuple[ModelConfig, dict[str, torch.Tensor], Tokenizer]:
    if source.kind == "gguf":
        with GGUFFile(source.path) as gguf:
            config, weights = _load_gguf(gguf, dtype)
            return config, weights, Tokenizer.from_gguf(gguf)
    if source.kind == "hf":
        config = _hf_config(source.path)
        weights = _load_safetensors(source.path, config.tie_word_embeddings, dtype)
        return config, weights, Tokenizer.from_folder(source.path)
    weights = {name: tensor.to(dtype) for name, tensor in tiny_weights(TINY_CONFIG).items()}
    return TINY_CONFIG, weights, Tokenizer.from_gguf(source.path)


def _disk_size(source: ModelSource) -> int:
    if source.kind == "gguf":
        return os.path.getsize(source.path)
    if source.kind == "hf":
        return sum(e.stat().st_size for e in os.scandir(source.path) if e.name.endswith(".safetensors"))
    return 0


@contextmanager
def _threads_for_size(nbytes: int):
    """Load models under 1 GiB on one thread. Their tensors are too small for torch's intra-op
    threads to pay off, and next to a busy process every parallel region waits for a descheduled
    thread: SmolLM2 loaded in 3-10 s with 2 threads on a loaded 2-core machine, ~1 s with one."""
    before = torch.get_num_threads()
    if nbytes < 1 << 30:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# --- tiny-random ------------------------------------------------------------------------------


def tiny_weights(config: ModelConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded N(0, 0.02) matrices and unit norms: the same dict on every call and machine."""
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in expected_shapes(config).items():
        if name.endswith("norm.weight"):
            weights[name] = torch.ones(shape)
        else:
            weights[name] = torch.randn(shape, generator=generator).mul_(0.02)
    return weights


# --- GGUF -------------------------------------------------------------------------------------

_GGUF_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GGUF_LAYER = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")

# architectures whose converter permuted q/k rows for llama.cpp's rotary kernel
_PERMUTED_ARCHS = {"llama"}
_GGUF_ARCHS = {"llama", "qwen2"}


def _hf_name(gguf_name: str, path: str) -> str:
    if gguf_name in _GGUF_GLOBAL_NAMES:
        return _GGUF_GLOBAL_NAMES[gguf_name]
    m = _GGUF_LAYER.fullmatch(gguf_name)
    if m and m[2] in _GGUF_LAYER_NAMES:
        return f"model.layers.{m[1]}.{_GGUF_LAYER_NAMES[m[2]]}.{m[3]}"
    hint = " (llama3-style rope frequencies are not supported)" if gguf_name == "rope_freqs.weight" else ""
    raise ModelLoadError(f"{path}: unexpected tensor {gguf_name!r}{hint}")


def _unpermute_rope_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row order: within each head it interleaves the two rotary halves."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape).contiguous()


def _load_gguf(gguf: GGUFFile, dtype: torch.dtype) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    config = _gguf_config(gguf)
    arch = gguf.metadata["general.architecture"]
    shapes = expected_shapes(config) | optional_shapes(config)
    weights = {}
    for name, info in gguf.tensors.items():
        hf_name = _hf_name(name, gguf.path)
        if hf_name in shapes and info.shape != shapes[hf_name]:  # before unpermuting, which assumes the shape
            raise ModelLoadError(f"{gguf.path}: {name} ({hf_name}) has shape {info.shape}, the config implies "
                                 f"{shapes[hf_name]}")
        if not is_supported(info.type):
            raise ModelLoadError(
                f"{gguf.path}: tensor {name!r} is {info.type_name}, which the loader cannot dequantise "
                f"(supported: {', '.join(sorted(SUPPORTED_TYPES))})"
            )
        tensor = dequantize(gguf.tensor_bytes(name), info.type, info.shape)
        if arch in _PERMUTED_ARCHS and hf_name.endswith(("q_proj.weight", "q_proj.bias")):
            tensor = _unpermute_rope_rows(tensor, config.num_heads)
        elif arch in _PERMUTED_ARCHS and hf_name.endswith(("k_proj.weight", "k_proj.bias")):
            tensor = _unpermute_rope_rows(tensor, config.num_kv_heads)
        weights[hf_name] = tensor.to(dtype)
    return config, weights


def _gguf_config(gguf: GGUFFile) -> ModelConfig:
    md, path = gguf.metadata, gguf.path
    arch = md.get("general.architecture")
    if arch not in _GGUF_ARCHS:
        raise ModelLoadError(f"{path}: architecture {arch!r} is not supported (only {sorted(_GGUF_ARCHS)})")

    def get(key, default=None, kind=int):
        value = md.get(f"{arch}.{key}", default)
        if value is None:
            raise ModelLoadError(f"{path}: GGUF metadata lacks {arch}.{key}")
        if not isinstance(value, (int, float)) or value <= 0:
            raise ModelLoadError(f"{path}: {arch}.{key} is {value!r}, expected a positive number")
        return kind(value)

    hidden, heads = get("embedding_length"), get("attention.head_count")
    head_dim = get("attention.key_length", hidden // heads)
    if get("rope.dimension_count", head_dim) != head_dim:
        raise ModelLoadError(f"{path}: partial rotary ({arch}.rope.dimension_count != head_dim) is not supported")
    vocab = md.get(f"{arch}.vocab_size") or len(md.get("tokenizer.ggml.tokens") or ())
    if not vocab and "token_embd.weight" in gguf.tensors:
        vocab = gguf.tensors["token_embd.weight"].shape[0]
    return ModelConfig(
        vocab_size=int(vocab or 0),
        hidden_size=hidden,
        intermediate_size=get("feed_forward_length"),
        num_layers=get("block_count"),
        num_heads=heads,
        num_kv_heads=get("attention.head_count_kv", heads),
        head_dim=head_dim,
        rms_norm_eps=get("attention.layer_norm_rms_epsilon", kind=_shortest_float32),
        rope_theta=get("rope.freq_base", 10000.0, kind=_shortest_float32),
        max_position_embeddings=get("context_length"),
        tie_word_embeddings="output.weight" not in gguf.tensors,
        rope_scaling=_gguf_rope_scaling(md, arch, path),
    )


def _shortest_float32(value: float) -> float:
    """GGUF stores these as float32: 1e-5 comes back as 9.99999974e-06; give back the 1e-5 it was."""
    return float(str(np.float32(value)))


def _gguf_rope_scaling(md: dict, arch: str, path: str) -> dict | None:
    kind = md.get(f"{arch}.rope.scaling.type")
    factor = md.get(f"{arch}.rope.scaling.factor") or md.get(f"{arch}.rope.scale_linear")
    if kind in (None, "none") and not factor:
        return None
    if kind in (None, "linear"):
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn" and factor and md.get(f"{arch}.rope.scaling.original_context_length"):
        original = int(md[f"{arch}.rope.scaling.original_context_length"])
        return {"rope_type": "yarn", "factor": float(factor), "original_max_position_embeddings": original}
    raise ModelLoadError(f"{path}: rope scaling {kind!r} (factor {factor!r}) is not supported")


# --- Hugging Face folder ------------------------------------------------------------------------

_HF_MODEL_TYPES = {"llama", "qwen2"}
_IGNORED_KEYS = re.compile(r".*rotary_emb\.inv_freq$")


def _hf_config(folder: str) -> ModelConfig:
    path = os.path.join(folder, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except ValueError as e:
        raise ModelLoadError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict) or cfg.get("model_type") not in _HF_MODEL_TYPES:
        kind = cfg.get("model_type") if isinstance(cfg, dict) else None
        raise ModelLoadError(f"{path}: model_type {kind!r} is not a supported Llama-family model")

    def need(key):
        value = cfg.get(key)
        if value is None:
            raise ModelLoadError(f"{path}: lacks {key!r}")
        if not isinstance(value, int) or value <= 0:
            raise ModelLoadError(f"{path}: {key} is {value!r}, expected a positive integer")
        return value

    hidden, heads = need("hidden_size"), need("num_attention_heads")
    # transformers >= 5 keeps theta and scaling together in rope_parameters
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    theta = rope.pop("rope_theta", cfg.get("rope_theta", 10000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    return ModelConfig(
        vocab_size=need("vocab_size"),
        hidden_size=hidden,
        intermediate_size=need("intermediate_size"),
        num_layers=need("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or hidden // heads,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        rope_scaling=None if rope_type == "default" else {**rope, "rope_type": rope_type},
    )


def _safetensors_files(folder: str) -> list[str]:
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                names = sorted(set(json.load(f)["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelLoadError(f"{index}: not a valid safetensors index ({e!r})") from None
        files = [os.path.join(folder, n) for n in names]
        for f in files:
            if not os.path.isfile(f):
                raise ModelLoadError(f"{f}: listed in {os.path.basename(index)} but missing")
        return files
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise ModelLoadError(f"{folder}: no *.safetensors files (other weight formats are not supported)")
    return files


def _load_safetensors(folder: str, tied: bool, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    weights = {}
    for file in _safetensors_files(folder):
        try:
            with safe_open(file, framework="pt") as f:
                for key in f.keys():
                    if not _IGNORED_KEYS.fullmatch(key):
                        weights[key] = f.get_tensor(key).to(dtype)
        except SafetensorError as e:
            raise ModelLoadError(f"{file}: unreadable safetensors ({e})") from None
    if tied:
        weights.pop("lm_head.weight", None)  # some checkpoints store the tied copy too
    return weights
