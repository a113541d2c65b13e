"""What names an adapter and what the engine knows about one it has loaded."""

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.base.errors import EngineError, ErrorCode

if TYPE_CHECKING:  # the matrices are tensors; naming what an adapter is needs no torch
    import torch

BASE_SLOT = -1  # the adapter slot of tokens of requests for the base model


@dataclass(frozen=True)
class AdapterRef:
    """An adapter as requests and the registry name it: `name@version`."""

    name: str
    version: str

    @property
    def key(self) -> str:
        return f"{self.name}@{self.version}"

    def validate(self) -> None:
        if not self.name or not self.version:
            raise EngineError(ErrorCode.INVALID_ARGUMENT, f"an adapter needs a name and a version, got {self.key!r}")
        if "@" in self.name:
            raise EngineError(ErrorCode.INVALID_ARGUMENT, f"adapter name {self.name!r} must not contain '@'")


@dataclass
class AdapterWeights:
    """One adapter's LoRA matrices as PEFT saved them, on the CPU."""

    rank: int
    scaling: float  # lora_alpha / rank, or lora_alpha / sqrt(rank) with rsLoRA
    # (layer, PEFT module name) -> (A [rank, in_features], B [out_features, rank])
    matrices: dict[tuple[int, str], tuple["torch.Tensor", "torch.Tensor"]]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for pair in self.matrices.values() for t in pair)


_adapter_ids = itertools.count()


@dataclass(frozen=True, eq=False)
class LoadedAdapter:
    """One load of an adapter. A reload after an unload is a new LoadedAdapter with a new id,
    so requests still running on the old weights never see the new ones."""

    ref: AdapterRef
    path: str  # as the caller gave it, under the adapter root
    sha256: str  # of the files as first read; a later re-read must match it
    rank: int
    modules: tuple[str, ...]  # PEFT modules it adapts
    id: int = field(default_factory=lambda: next(_adapter_ids))
