"""Where each PEFT target module lands in the engine's fused projections (engine/model/llama.py).

The model computes q, k and v in one matmul and gate and up in another, so an adapter's
delta for `k_proj` is added to the k slice of the fused qkv output, and so on."""

from dataclasses import dataclass

from engine.base.model_config import ModelConfig

TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Projection:
    name: str  # the LayerWeights field it adds to: qkv, o, gate_up, down
    modules: tuple[str, ...]  # the PEFT modules of its output slices, in order
    in_features: int
    slice_sizes: tuple[int, ...]

    @property
    def out_features(self) -> int:
        return sum(self.slice_sizes)

    @property
    def slice_offsets(self) -> tuple[int, ...]:
        """Start of each slice, then the end of the last one."""
        offsets = [0]
        for size in self.slice_sizes:
            offsets.append(offsets[-1] + size)
        return tuple(offsets)


def projections(config: ModelConfig) -> tuple[Projection, ...]:
    h, i = config.hidden_size, config.intermediate_size
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    return (
        Projection("qkv", ("q_proj", "k_proj", "v_proj"), h, (q, kv, kv)),
        Projection("o", ("o_proj",), q, (h,)),
        Projection("gate_up", ("gate_proj", "up_proj"), h, (i, i)),
        Projection("down", ("down_proj",), i, (h,)),
    )


def module_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """(out_features, in_features) of each target module."""
    return {
        module: (size, p.in_features)
        for p in projections(config)
        for module, size in zip(p.modules, p.slice_sizes)
    }
