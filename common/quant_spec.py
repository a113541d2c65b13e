"""The weight quantization spec: one width per layer type, written `embed=bf16,attn=int8,mlp=int4:g64,head=int8`
or as a preset's name (optionally followed by overrides: `balanced,head=bf16`). Parsing only: no
torch, so that the operator checks an EnginePool's spec with the same grammar the engine reads.
Whether a valid spec fits a model and a device is the engine's check (engine/quant/check.py).

Layer types: `embed` (the token embedding, only gathered), `attn` (q/k/v and o projections),
`mlp` (gate/up and down projections), `head` (the LM head, which a decode step reads whole).
Widths: `bf16` (unquantised), `int8` (one scale per output row: the layout of the CPU kernel),
`int4` (asymmetric, a scale and a zero per group of `g` input columns; default g64). Other
widths (int6, int5, fp8, ...) are refused: no kernel here runs them faster than bf16.
"""

from dataclasses import dataclass, replace

LAYER_TYPES = ("embed", "attn", "mlp", "head")
WIDTHS = ("bf16", "int8", "int4")
# the group sizes the CPU int4 kernel takes (torch's _weight_int4pack_mm_for_cpu)
INT4_GROUP_SIZES = (32, 64, 128, 256)
DEFAULT_INT4_GROUP = 64  # divides the input dims of SmolLM2 (576, 1536) and most Llama sizes
# bits each width stores per weight, scales left out (for messages and estimates)
WIDTH_BITS = {"bf16": 16, "int8": 8, "int4": 4}


class QuantSpecError(ValueError):
    """The spec cannot be read or asks for a width no kernel runs; the message says which part and why."""


@dataclass(frozen=True)
class LayerQuant:
    width: str = "bf16"
    group: int | None = None  # int4 only: input columns per scale

    def __str__(self) -> str:
        return self.width + (f":g{self.group}" if self.group else "")

    @property
    def quantized(self) -> bool:
        return self.width != "bf16"


@dataclass(frozen=True)
class QuantSpec:
    embed: LayerQuant = LayerQuant()
    attn: LayerQuant = LayerQuant()
    mlp: LayerQuant = LayerQuant()
    head: LayerQuant = LayerQuant()

    def __str__(self) -> str:
        return ",".join(f"{t}={getattr(self, t)}" for t in LAYER_TYPES)

    @property
    def quantized(self) -> bool:
        return any(getattr(self, t).quantized for t in LAYER_TYPES)


NO_QUANT = QuantSpec()


@dataclass(frozen=True)
class Preset:
    spec: str
    kl_budget: float  # mean KL (nats/token, teacher-forced) against bf16 it promises to stay under
    about: str


# chosen from `k25 bench quant` on SmolLM2-135M (docs/benchmarks/index.md); each promises a mean KL
# against the unquantised model (teacher-forced), which tests/engine/quant/test_quant_presets.py checks
PRESETS = {
    "none": Preset("embed=bf16,attn=bf16,mlp=bf16,head=bf16", 0.0, "unquantised"),
    "int8": Preset("embed=bf16,attn=int8,mlp=int8,head=int8", 0.02, "every projection and the head in int8"),
    "balanced": Preset("embed=bf16,attn=int8,mlp=int4:g32,head=int8", 0.02,
                       "the MLP (most of the bytes) in int4, attention and the head in int8"),
    "small": Preset("embed=bf16,attn=int4:g32,mlp=int4:g32,head=int4:g32", 0.05,
                    "every projection and the head in int4: over 3x fewer bytes a decode step than bf16"),
}


def parse_layer_quant(layer_type: str, text: str) -> LayerQuant:
    width, _, group_text = text.partition(":")
    if width not in WIDTHS:
        raise QuantSpecError(
            f"{layer_type}={text}: width {width!r} has no fast kernel here; widths: {', '.join(WIDTHS)}"
        )
    if not group_text:
        return LayerQuant(width, DEFAULT_INT4_GROUP if width == "int4" else None)
    if width != "int4":
        raise QuantSpecError(f"{layer_type}={text}: a group size applies to int4 only "
                             f"({width} has {'one scale per output row' if width == 'int8' else 'no scales'})")
    if not (group_text.startswith("g") and group_text[1:].isdigit()):
        raise QuantSpecError(f"{layer_type}={text}: the group size is written gN, e.g. int4:g64")
    group = int(group_text[1:])
    if group not in INT4_GROUP_SIZES:
        raise QuantSpecError(f"{layer_type}={text}: the int4 kernel takes group sizes "
                             f"{', '.join(map(str, INT4_GROUP_SIZES))}, not {group}")
    return LayerQuant(width, group)


def parse_quant_spec(text: str) -> QuantSpec:
    """A preset's name, `TYPE=WIDTH[:gN],...`, or a preset followed by such overrides; types not
    named stay bf16 (or the preset's). Raises QuantSpecError naming the bad part."""
    if any(c.isspace() for c in text):
        raise QuantSpecError(f"quant spec {text!r}: write it without spaces, e.g. attn=int8,mlp=int4")
    items = text.split(",")
    if any(not item for item in items):
        raise QuantSpecError(f"empty item in quant spec {text!r}; write e.g. attn=int8,mlp=int4 or a preset "
                             f"({', '.join(PRESETS)})")
    spec, named = NO_QUANT, set()
    if "=" not in items[0]:
        if items[0] not in PRESETS:
            raise QuantSpecError(f"unknown quant preset {items[0]!r}; presets: {', '.join(PRESETS)}")
        spec = parse_quant_spec(PRESETS[items[0]].spec)
        items = items[1:]
    for item in items:
        layer_type, eq, width = item.partition("=")
        if not eq:
            raise QuantSpecError(f"{item!r}: write TYPE=WIDTH, e.g. mlp=int4 (a preset may only come first)")
        if layer_type not in LAYER_TYPES:
            raise QuantSpecError(f"unknown layer type {layer_type!r}; layer types: {', '.join(LAYER_TYPES)}")
        if layer_type in named:
            raise QuantSpecError(f"layer type {layer_type!r} is set twice")
        named.add(layer_type)
        layer = parse_layer_quant(layer_type, width)
        if layer_type == "embed" and layer.width == "int4":
            raise QuantSpecError("embed=int4: the embedding takes bf16 or int8 (it is only gathered, a few rows a "
                                 "step, so its width saves memory, not time)")
        spec = replace(spec, **{layer_type: layer})
    return spec


def quant_spec_pattern() -> str:
    """A regular expression for the specs the parser can read (a schema's `pattern`): a preset or an
    item first, then items. What it cannot see (a type set twice, embed=int4) only the parser refuses."""
    groups = "|".join(map(str, INT4_GROUP_SIZES))
    widths = "|".join(w + (f"(:g({groups}))?" if w == "int4" else "") for w in WIDTHS)
    item = f"({'|'.join(LAYER_TYPES)})=({widths})"
    return f"^({'|'.join(PRESETS)}|{item})(,{item})*$"
