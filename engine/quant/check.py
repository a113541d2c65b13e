"""Whether a quant spec (common/quant_spec.py) can run on a model and a device, as pure
functions: the engine refuses to start, with the reason, rather than run a width slowly. On a
CPU torch's weight-only kernels run the widths, on CUDA the Triton dequantising matmul."""

from common.quant_spec import LAYER_TYPES, QuantSpec
from engine.base.errors import EngineConfigError
from engine.base.model_config import ModelConfig

# the CPU int4 kernel packs output rows 16 at a time (the Triton kernel on CUDA takes any count)
INT4_ROW_MULTIPLE = 16


def projection_shapes(config: ModelConfig) -> dict[str, list[tuple[str, int, int]]]:
    """Each layer type's matrices as (name, out, in) (the engine stacks q/k/v and gate/up)."""
    h, i = config.hidden_size, config.intermediate_size
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    return {
        "embed": [("embed_tokens", config.vocab_size, h)],
        "attn": [("qkv", q + 2 * kv, h), ("o", h, q)],
        "mlp": [("gate_up", 2 * i, h), ("down", h, i)],
        "head": [("lm_head", config.vocab_size, h)],
    }


def resolve_dtype(requested: str, spec: QuantSpec) -> str:
    """--dtype auto with quantised weights is bfloat16 (the kernels' activations); else as requested."""
    return "bfloat16" if spec.quantized and requested == "auto" else requested


def check_quant(spec: QuantSpec, config: ModelConfig, device: str, dtype: str) -> None:
    """Raise EngineConfigError naming the first reason `spec` cannot run here."""
    if not spec.quantized:
        return
    if dtype != "bfloat16":
        raise EngineConfigError(f"--quant {spec}: quantised weights run with bfloat16 activations, and the layers left "
                                f"unquantised stay in the engine's dtype; use --dtype bfloat16 or auto, not {dtype}")
    shapes = projection_shapes(config)
    for layer_type in LAYER_TYPES:
        layer = getattr(spec, layer_type)
        if layer.width != "int4" or layer_type == "embed":
            continue
        for name, out_dim, in_dim in shapes[layer_type]:
            if in_dim % layer.group:
                raise EngineConfigError(f"{layer_type}={layer}: group size {layer.group} does not divide {name}'s "
                                        f"input dim {in_dim}; pick a group size that divides it")
            if out_dim % INT4_ROW_MULTIPLE and not device.startswith("cuda"):
                raise EngineConfigError(f"{layer_type}={layer}: {name} has {out_dim} output rows, and the int4 kernel "
                                        f"packs them {INT4_ROW_MULTIPLE} at a time; use int8 for {layer_type}")
    if config.tie_word_embeddings and spec.embed.quantized and not spec.head.quantized:
        raise EngineConfigError(f"embed={spec.embed} with head=bf16: the model ties its embedding to the head, whose bf16 "
                                "rows the embedding then shares; an int8 embedding would add a copy, not save one")
