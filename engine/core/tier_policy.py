"""Which block a bounded KV tier (host memory, local disk) gives up when it needs room.

Pure Python, no tensors, no I/O: the tiers' mechanism (engine/kv_tiers/) keeps one
TierIndex per tier and asks it where a key lives and which key to drop.

The score weighs how recently and how often a block was used: recency decays exponentially
with the block's age, frequency saturates with its use count. The block with the lowest
score goes first; a pinned block (one a running request is reading or a copy is moving)
never goes."""

import heapq
import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ScoreWeights:
    recency_weight: float = 0.5  # 1: recency only (LRU), 0: frequency only (LFU)
    decay_per_s: float = 0.01  # a block unused for 1/decay seconds keeps 1/e of its recency

    def __post_init__(self):
        if not 0.0 <= self.recency_weight <= 1.0 or self.decay_per_s < 0 or not math.isfinite(self.decay_per_s):
            raise ValueError(f"recency weight must be in [0, 1] and decay at least 0, got {self}")


def eviction_score(last_used: float, uses: int, now: float, weights: ScoreWeights) -> float:
    """Higher keeps: weight x exp(-decay x age) + (1 - weight) x uses / (uses + 1), in [0, 1]."""
    recency = math.exp(-weights.decay_per_s * max(0.0, now - last_used))
    frequency = uses / (uses + 1.0)
    return weights.recency_weight * recency + (1.0 - weights.recency_weight) * frequency


@dataclass
class TierEntry:
    slot: int  # where the tier keeps the block: a row of the host pool, a file's serial number
    last_used: float
    uses: int = 1
    pins: int = 0


@dataclass
class TierIndex:
    """A bounded map from block key to where one tier keeps it. Slots are 0..capacity-1, each
    held by at most one key: a key is never in a tier twice, and a tier never holds more than
    its bound."""

    capacity: int
    weights: ScoreWeights = field(default_factory=ScoreWeights)

    def __post_init__(self):
        if self.capacity < 0:
            raise ValueError(f"a tier holds at least 0 blocks, got {self.capacity}")
        self._entries: dict[int, TierEntry] = {}
        self._free_slots = list(range(self.capacity - 1, -1, -1))
        # keys added or removed since it was set (None: not recorded): what the engine's KV
        # events announce (engine/core/engine_core.py); tiers may share one set
        self.changed: set[int] | None = None

    def __contains__(self, key: int) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[int]:
        return list(self._entries)

    def get(self, key: int) -> TierEntry | None:
        return self._entries.get(key)

    @property
    def is_full(self) -> bool:
        return not self._free_slots

    def touch(self, key: int, now: float) -> None:
        """A lookup found `key`: it counts as used now."""
        entry = self._entries[key]
        entry.last_used = max(entry.last_used, now)
        entry.uses += 1

    def pin(self, key: int) -> None:
        self._entries[key].pins += 1

    def unpin(self, key: int) -> None:
        entry = self._entries[key]
        if entry.pins <= 0:
            raise RuntimeError(f"block {key:#x} is not pinned")
        entry.pins -= 1

    def victims(self, count: int, now: float) -> list[int]:
        """Up to `count` unpinned keys, lowest score first."""
        unpinned = ((k, e) for k, e in self._entries.items() if e.pins == 0)
        lowest = heapq.nsmallest(count, unpinned, key=lambda ke: eviction_score(ke[1].last_used, ke[1].uses, now, self.weights))
        return [k for k, _ in lowest]

    def add(self, key: int, now: float, uses: int = 1) -> tuple[int, list[int]] | None:
        """Store `key`, giving up the lowest-scored unpinned key if the tier is full. Returns
        (its slot, the keys given up), or None when every slot is pinned or the tier holds
        nothing (capacity 0). A key already here is only touched."""
        if key in self._entries:
            self.touch(key, now)
            return self._entries[key].slot, []
        evicted = []
        if not self._free_slots:
            evicted = self.victims(1, now)
            if not evicted:
                return None
            self.remove(evicted[0])
        slot = self._free_slots.pop()
        self._entries[key] = TierEntry(slot, now, uses)
        if self.changed is not None:
            self.changed.add(key)
        return slot, evicted

    def remove(self, key: int) -> TierEntry:
        """Forget `key` (dropped, or found corrupt); its slot is free again. A pinned key is refused."""
        entry = self._entries[key]
        if entry.pins:
            raise RuntimeError(f"block {key:#x} is pinned; it cannot leave the tier")
        del self._entries[key]
        self._free_slots.append(entry.slot)
        if self.changed is not None:
            self.changed.add(key)
        return entry
