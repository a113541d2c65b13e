"""What the vLLM backend needs to know of a model before vLLM loads it, read from its Hugging Face
folder for any architecture vLLM serves (K25's own loader knows only the Llama family): the KV
a token takes, the context, the vocabulary and the weights' size."""

import glob
import json
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    num_parameters: int


def shape_from_config(config: dict, num_parameters: int) -> ModelShape:
    """From config.json (a multimodal model's text_config if it has one)."""
    text = config.get("text_config") or config
    heads = text["num_attention_heads"]
    return ModelShape(
        num_layers=text["num_hidden_layers"],
        num_kv_heads=text.get("num_key_value_heads") or heads,
        head_dim=text.get("head_dim") or text["hidden_size"] // heads,
        vocab_size=text["vocab_size"],
        max_position_embeddings=text.get("max_position_embeddings", 2048),
        num_parameters=num_parameters,
    )


def read_shape(folder: str) -> ModelShape:
    from safetensors import safe_open

    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    count = 0
    for path in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        with safe_open(path, "np") as weights:  # the header only
            for name in weights.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                shape = weights.get_slice(name).get_shape()
                size = 1
                for dim in shape:
                    size *= dim
                count += size
    return shape_from_config(config, count)
