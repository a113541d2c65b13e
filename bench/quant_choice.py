"""The cheapest layered spec within a KL budget, from the per-layer-type table: a pure
function. KLs of small, independent perturbations add up about linearly, so a spec's KL is
estimated as the sum of its layer types' own; the caller measures the candidates in order of
bytes and takes the first whose measured KL is within the budget."""

import itertools
from dataclasses import dataclass

from common.quant_spec import LAYER_TYPES, LayerQuant, QuantSpec


@dataclass(frozen=True)
class Option:
    """One layer type at one width: the KL it adds alone and the bytes a decode step reads of it."""
    layer_type: str
    layer: LayerQuant
    kl: float
    bytes_read: int


@dataclass(frozen=True)
class Candidate:
    spec: QuantSpec
    estimated_kl: float
    bytes_read: int


def candidates_within(options: list[Option], budget: float) -> list[Candidate]:
    """Every combination of one option per layer type (bf16 at KL 0 must be among them) whose
    summed KL is within `budget`, cheapest in bytes first (then lowest KL)."""
    by_type = {t: [o for o in options if o.layer_type == t] for t in LAYER_TYPES}
    missing = [t for t, found in by_type.items() if not found]
    if missing:
        raise ValueError(f"no option for layer types {missing}")
    found = []
    for combo in itertools.product(*by_type.values()):
        kl = sum(o.kl for o in combo)
        if kl <= budget:
            spec = QuantSpec(**{o.layer_type: o.layer for o in combo})
            found.append(Candidate(spec, kl, sum(o.bytes_read for o in combo)))
    return sorted(found, key=lambda c: (c.bytes_read, c.estimated_kl))
