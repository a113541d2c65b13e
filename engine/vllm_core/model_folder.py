"""The Hugging Face folder vLLM loads for a model K25 names. A folder is used as it is; a GGUF
(the default SmolLM2 among them) or the tiny random model is written once, by K25's own loader
(dequantised to float32, Hugging Face naming) and tokenizer (the one the gateway uses), into a
cache folder keyed by the file's fingerprint, so that both backends serve the same weights and
vocabulary from the same `--model`. vLLM needs the tokenizer only for structured outputs (its
grammars are compiled over the vocabulary); token ids come in and go out."""

import json
import logging
import os
import tempfile

from common.model_source import TINY_MODEL, resolve_model
from engine.base.model_config import ModelConfig
from engine.model.fingerprint import model_fingerprint

log = logging.getLogger(__name__)
FOLDER_FORMAT = 2  # part of the cache folder's name: a folder an older K25 wrote is written again


def default_cache_root() -> str:
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "k25", "hf-models")


def hf_config(config: ModelConfig, bos_token_id: int | None, eos_token_id: int | None) -> dict:
    """config.json of a Llama checkpoint of this shape."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads, "head_dim": config.head_dim, "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta, "rope_scaling": config.rope_scaling,
        "max_position_embeddings": config.max_position_embeddings, "tie_word_embeddings": config.tie_word_embeddings,
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "torch_dtype": "float32",
        "bos_token_id": bos_token_id, "eos_token_id": eos_token_id,
    }


def vllm_model_folder(name_or_path: str, cache_root: str | None = None) -> str:
    source = resolve_model(name_or_path)
    if source.kind == "hf":
        return source.path
    key = "tiny-random" if source.kind == "tiny" else model_fingerprint(source.path)
    folder = os.path.join(cache_root or default_cache_root(), f"{key}-{FOLDER_FORMAT}")
    if os.path.exists(os.path.join(folder, "config.json")):
        return folder
    _write_folder(TINY_MODEL if source.kind == "tiny" else source.path, folder)
    return folder


def _write_folder(name_or_path: str, folder: str) -> None:
    """Load with K25's loader and write config.json + model.safetensors; written aside and renamed,
    so a folder that exists is whole."""
    import torch
    from safetensors.torch import save_file

    from engine.model.loader import load_model

    log.info("writing %s as a Hugging Face folder for vLLM: %s", name_or_path, folder)
    model = load_model(name_or_path, torch.float32)
    parent = os.path.dirname(folder)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(dir=parent, prefix=".writing-")
    save_file({name: t.contiguous() for name, t in model.weights.items()}, os.path.join(staging, "model.safetensors"),
              metadata={"format": "pt"})
    tokenizer = model.tokenizer
    tokenizer.save(staging)
    with open(os.path.join(staging, "config.json"), "w") as f:  # last: its presence means the folder is whole
        json.dump(hf_config(model.config, tokenizer.bos_token_id, tokenizer.eos_token_id), f, indent=1)
    try:
        os.rename(staging, folder)
    except OSError:  # another process wrote it first
        if not os.path.exists(os.path.join(folder, "config.json")):
            raise
