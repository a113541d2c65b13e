"""PEFT's LoRA format: adapter_config.json plus lora_A / lora_B matrices per target module.

Only plain LoRA on the attention and MLP projections of a Llama-family model is served;
every PEFT option that would change the computation is refused by name rather than ignored."""

import json
import math
import re

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors

from engine.base.errors import EngineError, ErrorCode
from engine.base.model_config import ModelConfig
from engine.lora.adapter import AdapterWeights
from engine.lora.layout import TARGET_MODULES, module_shapes
from engine.lora.source import AdapterFiles

# adapter_config.json options that must be off (absent, null, false, empty) for plain LoRA
UNSUPPORTED_OPTIONS = {
    "use_dora": "DoRA",
    "lora_bias": "LoRA biases",
    "modules_to_save": "modules_to_save (fully trained extra modules)",
    "rank_pattern": "per-module ranks (rank_pattern)",
    "alpha_pattern": "per-module alphas (alpha_pattern)",
    "layer_replication": "layer_replication",
    "trainable_token_indices": "trainable token embeddings",
    "alora_invocation_tokens": "activated LoRA",
    "use_qalora": "QA-LoRA",
    "fan_in_fan_out": "fan_in_fan_out (transposed weights)",
}

PEFT_DEFAULT_ALPHA = 8  # what LoraConfig uses when the file has no lora_alpha

# base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight
_KEY = re.compile(r"(?:.*\.)?layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight")


def _invalid(message: str) -> EngineError:
    return EngineError(ErrorCode.INVALID_ARGUMENT, message)


def parse_peft_adapter(files: AdapterFiles, model: ModelConfig, max_rank: int) -> AdapterWeights:
    where = files.directory.name
    config = _config(files.config, where)
    rank = config["r"]
    if rank > max_rank:
        raise _invalid(f"adapter {where}: rank {rank} exceeds this engine's max_lora_rank {max_rank}")
    try:
        tensors = load_safetensors(files.weights)
    except (SafetensorError, ValueError) as exc:
        raise _invalid(f"adapter {where}: adapter_model.safetensors is not a safetensors file ({exc})") from None
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.fullmatch(key)
        if match is None or match.group(2) not in TARGET_MODULES:
            raise _invalid(
                f"adapter {where}: tensor {key!r} is not a LoRA A/B matrix of a supported module ({', '.join(TARGET_MODULES)})"
            )
        layer = int(match.group(1))
        if layer >= model.num_layers:
            raise _invalid(f"adapter {where}: tensor {key!r} is for layer {layer}; the model has {model.num_layers}")
        halves.setdefault((layer, match.group(2)), {})[match.group(3)] = tensor
    if not halves:
        raise _invalid(f"adapter {where}: adapter_model.safetensors holds no LoRA matrices")
    shapes = module_shapes(model)
    matrices = {}
    for (layer, module), pair in sorted(halves.items()):
        if set(pair) != {"A", "B"}:
            raise _invalid(f"adapter {where}: layer {layer} {module} has lora_{''.join(pair)} but not both A and B")
        out_features, in_features = shapes[module]
        a, b = pair["A"], pair["B"]
        if a.shape != (rank, in_features) or b.shape != (out_features, rank):
            raise _invalid(
                f"adapter {where}: layer {layer} {module} has A {tuple(a.shape)} and B {tuple(b.shape)}; rank {rank} on "
                f"this model needs A {(rank, in_features)} and B {(out_features, rank)} (an adapter for another model?)"
            )
        matrices[(layer, module)] = (a, b)
    alpha = config["lora_alpha"]
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return AdapterWeights(rank=rank, scaling=scaling, matrices=matrices)


def _config(raw: bytes, where: str) -> dict:
    try:
        config = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _invalid(f"adapter {where}: adapter_config.json is not JSON ({exc})") from None
    if not isinstance(config, dict):
        raise _invalid(f"adapter {where}: adapter_config.json is not a JSON object")
    if config.get("peft_type", "LORA") != "LORA":
        raise _invalid(f"adapter {where}: peft_type {config['peft_type']!r} is not LORA")
    rank, alpha = config.get("r"), config.get("lora_alpha", PEFT_DEFAULT_ALPHA)
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise _invalid(f"adapter {where}: r must be a positive integer, got {rank!r}")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise _invalid(f"adapter {where}: lora_alpha must be a number, got {alpha!r}")
    if config.get("bias", "none") not in ("none", None):
        raise _invalid(f"adapter {where}: bias={config['bias']!r} is not supported (only 'none')")
    for option, what in UNSUPPORTED_OPTIONS.items():
        if config.get(option):
            raise _invalid(f"adapter {where}: {what} is not supported ({option}={config[option]!r})")
    return config | {"lora_alpha": alpha}
