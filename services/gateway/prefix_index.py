"""Which engines hold which prefix blocks, as far as this gateway knows: what the engines
announced (KV events, engine/serve/kv_events.py) and where this gateway itself sent prompts.

One entry per block hash (common/prefix_hash.py) holding a bitmask of the engines that
hold it; at most `max_blocks` entries, the least recently used going first. An engine that
leaves the registry, restarts (a new incarnation) or says `cleared` loses its bit at once
(lookups stop seeing it); `sweep` then clears that bit from the entries a slice at a time,
so that forgetting an engine never stalls lookups for a pass over a million entries, and
only then is the bit given to another engine. The index is a routing hint: an entry that
is wrong costs a cache miss, never a wrong answer.

Thread-safe: the listener thread applies events and sweeps while the event loop looks up prompts."""

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping

from proto import k25_pb2


class PrefixIndex:
    def __init__(self, max_blocks: int, sweep_slice: int = 20_000):
        if max_blocks < 1:
            raise ValueError(f"the prefix index needs room for at least one block, got {max_blocks}")
        self.max_blocks = max_blocks
        self.sweep_slice = sweep_slice
        self.evicted = 0  # entries dropped for room
        self._entries: OrderedDict[int, int] = OrderedDict()  # block hash -> bitmask of engine bits
        self._bit_of: dict[str, int] = {}  # engine id -> its bit
        self._incarnation_of: dict[str, str] = {}
        self._live = 0  # bits of the engines in _bit_of
        self._dead = 0  # bits of forgotten engines still set in some entries
        self._sweep: tuple[int, list[int], int] | None = None  # (bits being cleared, keys to visit, next key)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def engines(self) -> set[str]:
        return set(self._bit_of)

    def apply(self, event: k25_pb2.KVEvents) -> None:
        """An engine's announcement: forget what it said before if it restarted or cleared,
        then drop what it evicted and add what it cached."""
        with self._lock:
            if event.cleared or self._incarnation_of.get(event.engine_id, event.incarnation) != event.incarnation:
                self._forget(event.engine_id)
            bit = self._bit_for(event.engine_id, event.incarnation)
            for h in event.removed:
                mask = self._entries.get(h)
                if mask is not None and mask & bit:
                    if mask == bit:
                        del self._entries[h]
                    else:
                        self._entries[h] = mask & ~bit
            self._add(bit, event.stored)

    def record(self, engine_id: str, incarnation: str, hashes: Iterable[int]) -> None:
        """This gateway sent a prompt with these block hashes to the engine: it will hold them
        (its own events confirm it, or take it back, shortly after)."""
        with self._lock:
            if self._incarnation_of.get(engine_id, incarnation) != incarnation:
                self._forget(engine_id)
            self._add(self._bit_for(engine_id, incarnation), hashes)

    def matched_blocks(self, hashes: list[int]) -> dict[str, int]:
        """For each engine that holds the first block of `hashes`, how many blocks from the
        start it holds; the entries found become the most recently used."""
        matched: dict[str, int] = {}
        with self._lock:
            engine_of = {bit: engine_id for engine_id, bit in self._bit_of.items()}
            alive = 0
            for i, h in enumerate(hashes):
                mask = self._entries.get(h, 0) & (self._live if i == 0 else alive)
                for bit in _bits(alive & ~mask):
                    matched[engine_of[bit]] = i
                alive = mask
                if not alive:
                    break
                self._entries.move_to_end(h)
            for bit in _bits(alive):
                matched[engine_of[bit]] = len(hashes)
        return matched

    def retain(self, live: Mapping[str, str]) -> None:
        """Keep only engines that are live with the incarnation the registry shows (engine id -> incarnation)."""
        with self._lock:
            for engine_id in list(self._bit_of):
                if live.get(engine_id) != self._incarnation_of[engine_id]:
                    self._forget(engine_id)

    def sweep(self) -> bool:
        """Clear forgotten engines' bits from one slice of the entries; True when none are left."""
        with self._lock:
            if self._sweep is None:
                if not self._dead:
                    return True
                self._sweep = (self._dead, list(self._entries), 0)
            bits, keys, start = self._sweep
            end = min(start + self.sweep_slice, len(keys))
            for h in keys[start:end]:
                mask = self._entries.get(h)
                if mask is not None and mask & bits:
                    if mask & ~bits:
                        self._entries[h] = mask & ~bits
                    else:
                        del self._entries[h]
            if end < len(keys):
                self._sweep = (bits, keys, end)
                return False
            self._dead &= ~bits
            self._sweep = None
            return not self._dead

    def _bit_for(self, engine_id: str, incarnation: str) -> int:
        bit = self._bit_of.get(engine_id)
        if bit is None:
            taken = self._live | self._dead
            bit = (taken + 1) & ~taken  # the lowest bit neither an engine nor a pending sweep has
            self._bit_of[engine_id] = bit
            self._live |= bit
        self._incarnation_of[engine_id] = incarnation
        return bit

    def _add(self, bit: int, hashes: Iterable[int]) -> None:
        entries = self._entries
        for h in hashes:
            entries[h] = entries.get(h, 0) | bit
            entries.move_to_end(h)
        while len(entries) > self.max_blocks:
            entries.popitem(last=False)
            self.evicted += 1

    def _forget(self, engine_id: str) -> None:
        bit = self._bit_of.pop(engine_id, None)
        self._incarnation_of.pop(engine_id, None)
        if bit is not None:
            self._live &= ~bit
            self._dead |= bit


def _bits(mask: int) -> Iterable[int]:
    while mask:
        low = mask & -mask
        yield low
        mask ^= low
