"""`k25 bench quant`: what each layer type's width costs in accuracy (KL against the
unquantised bf16 model, teacher-forced over a fixed English and Chinese text set) and what the
presets give in bytes and decode speed, measured side by side with the unquantised engine in
the same run."""

import pathlib
from dataclasses import asdict, dataclass, field, replace

import torch

from bench.engine_bench import decode_step_seconds
from bench.quant_bytes import decode_weight_bytes
from bench.quant_choice import Candidate, Option, candidates_within
from bench.quant_kl import Divergence, divergence, teacher_forced_logprobs
from common.quant_spec import INT4_GROUP_SIZES, LAYER_TYPES, NO_QUANT, PRESETS, LayerQuant, QuantSpec, parse_quant_spec
from engine.base.config import EngineConfig
from engine.base.errors import EngineConfigError
from engine.model.llama import LlamaModel
from engine.model.loader import LoadedModel
from engine.quant.check import check_quant

# the default text set: the repository's contract fixtures, English and Chinese
DEFAULT_TEXTS = sorted((pathlib.Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "contracts").glob("*.txt"))
# how many candidates --kl-budget measures before it gives up on the additive estimate
MAX_CHECKED_CANDIDATES = 4


def layer_options(layer_type: str) -> list[LayerQuant]:
    """The quantised widths a layer type can take (the bf16 baseline aside)."""
    if layer_type == "embed":
        return [LayerQuant("int8")]
    return [LayerQuant("int8")] + [LayerQuant("int4", g) for g in INT4_GROUP_SIZES]


@dataclass
class LayerRow:
    layer_type: str
    width: str
    mean_kl: float
    top1_agreement: float
    bytes_read: int  # of this layer type, a decode step at batch 1
    bf16_bytes_read: int


@dataclass
class SpecRow:
    name: str  # a preset's name, "bf16" for the baseline, or "recommended"
    spec: str
    kl_budget: float | None
    mean_kl: float
    perplexity: float
    top1_agreement: float
    bytes_read: int  # weights a decode step at batch 1 reads
    memory_bytes: int  # weights held
    tokens_per_s: dict = field(default_factory=dict)  # batch -> decode tokens/s

    def ratio(self, baseline: "SpecRow", batch: int) -> float:
        return self.tokens_per_s[batch] / baseline.tokens_per_s[batch]


@dataclass
class QuantBenchResult:
    texts: list[str]
    positions: int
    decode_context: int
    layers: list[LayerRow]
    specs: list[SpecRow]  # the bf16 baseline first
    kl_budget: float | None = None
    recommended: SpecRow | None = None
    recommendation_note: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def _model(loaded: LoadedModel, spec: QuantSpec) -> LlamaModel:
    return LlamaModel(loaded.config, loaded.weights, "cpu", torch.bfloat16, quant=spec)


class Measurer:
    """The baseline's distributions, computed once; any spec's divergence from them."""

    def __init__(self, loaded: LoadedModel, texts: list[list[int]]):
        self.loaded, self.texts = loaded, texts
        self.references = [teacher_forced_logprobs(_model(loaded, NO_QUANT), t) for t in texts]

    def measure(self, spec: QuantSpec) -> tuple[Divergence, LlamaModel]:
        model = _model(self.loaded, spec)
        candidates = [teacher_forced_logprobs(model, t) for t in self.texts]
        return divergence(self.references, candidates, self.texts), model

    def spec_row(self, name: str, spec: QuantSpec, budget: float | None) -> SpecRow:
        d, model = self.measure(spec)
        return SpecRow(name, str(spec), budget, d.mean_kl, d.perplexity, d.top1_agreement,
                       sum(decode_weight_bytes(model).values()), model.weight_bytes)


def fits(spec: QuantSpec, loaded: LoadedModel) -> bool:
    try:
        check_quant(spec, loaded.config, "cpu", "bfloat16")
    except EngineConfigError:
        return False
    return True


def bench_quant(loaded: LoadedModel, texts: list[list[int]], text_names: list[str], batches: tuple[int, ...] = (1, 32),
                decode_context: int = 128, decode_steps: int = 16, rounds: int = 2, kl_budget: float | None = None,
                progress=print) -> QuantBenchResult:
    measurer = Measurer(loaded, texts)
    baseline_bytes = decode_weight_bytes(_model(loaded, NO_QUANT))
    layers, options = [], [Option(t, LayerQuant(), 0.0, baseline_bytes[t]) for t in LAYER_TYPES]
    for layer_type in LAYER_TYPES:
        for layer in layer_options(layer_type):
            spec = replace(NO_QUANT, **{layer_type: layer})
            if layer_type != "embed" and not fits(spec, loaded):
                continue  # e.g. a group size that does not divide the input dims
            progress(f"KL: {layer_type}={layer}")
            d, model = measurer.measure(spec)
            read = decode_weight_bytes(model)[layer_type]
            layers.append(LayerRow(layer_type, str(layer), d.mean_kl, d.top1_agreement, read, baseline_bytes[layer_type]))
            options.append(Option(layer_type, layer, d.mean_kl, read))
    progress("KL: the bf16 baseline and the presets")
    specs = [measurer.spec_row("bf16", NO_QUANT, None)]
    specs += [measurer.spec_row(name, parse_quant_spec(name), p.kl_budget) for name, p in PRESETS.items() if name != "none"]
    result = QuantBenchResult(text_names, sum(map(len, texts)), decode_context, layers, specs, kl_budget)
    if kl_budget is not None:
        _recommend(result, measurer, candidates_within(options, kl_budget), progress)
    rows = specs + ([result.recommended] if result.recommended else [])
    _decode_speeds(loaded, rows, batches, decode_context, decode_steps, rounds, progress)
    return result


def _recommend(result: QuantBenchResult, measurer: Measurer, candidates: list[Candidate], progress) -> None:
    """The cheapest candidate whose measured KL is within the budget (the estimate is a sum)."""
    candidates = [c for c in candidates if fits(c.spec, measurer.loaded)]  # e.g. embed=int8 needs a quantised tied head
    for candidate in candidates[:MAX_CHECKED_CANDIDATES]:
        progress(f"KL: candidate {candidate.spec} (estimated {candidate.estimated_kl:.4f})")
        row = measurer.spec_row("recommended", candidate.spec, result.kl_budget)
        if row.mean_kl <= result.kl_budget:
            result.recommended = row
            result.recommendation_note = (f"estimated KL {candidate.estimated_kl:.4f} (sum of its layer types'), "
                                          f"measured {row.mean_kl:.4f}")
            return
    checked = min(len(candidates), MAX_CHECKED_CANDIDATES)
    result.recommendation_note = (f"none of the {checked} cheapest candidates measured within {result.kl_budget}"
                                  if candidates else "no layered spec is estimated within the budget")


def _decode_speeds(loaded: LoadedModel, rows: list[SpecRow], batches, context: int, steps: int, rounds: int, progress) -> None:
    """Decode tokens/s of each spec's engine at each batch size: the specs in turn, `rounds`
    times, the best of its rounds each (the rounds interleave, so a slow spell hits all alike)."""
    for r in range(rounds):
        for row in rows:
            quant = None if row.spec == str(NO_QUANT) else row.spec
            config = EngineConfig(dtype="bfloat16", quant=quant, max_num_seqs=max(batches))
            for batch in batches:
                progress(f"decode: {row.name}, batch {batch}, round {r + 1} of {rounds}")
                seconds, _ = decode_step_seconds(loaded, config, context, steps, batch)
                row.tokens_per_s[batch] = max(row.tokens_per_s.get(batch, 0.0), batch / seconds)
