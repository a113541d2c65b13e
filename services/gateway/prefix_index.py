"""Which engines hold which prefix blocks, and in which tier, as far as this gateway knows: what
the engines announced (KV events, engine/serve/kv_events.py) and where this gateway itself sent
prompts.

One entry per block hash (common/prefix_hash.py) holding a bitmask: each engine has a group of
three bits, one per tier (device, host memory, local disk), and sets at most the one of the
highest tier that holds the block. At most `max_blocks` entries, the least recently used going
first. An engine that leaves the registry, restarts (a new incarnation) or says `cleared` loses
its group at once (lookups stop seeing it); `sweep` then clears that group from the entries a
slice at a time, so that forgetting an engine never stalls lookups for a pass over a million
entries, and only then is the group given to another engine. The index is a routing hint: an
entry that is wrong costs a cache miss, never a wrong answer.

Thread-safe: the listener thread applies events and sweeps while the event loop looks up prompts."""

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping

from proto import k25_pb2
from services.gateway.held_prefix import HeldRun

# an engine's group: its anchor bit (the device tier) and the two above it
DEVICE_SHIFT, HOST_SHIFT, DISK_SHIFT = 0, 1, 2
GROUP_BITS = 3


class PrefixIndex:
    def __init__(self, max_blocks: int, sweep_slice: int = 20_000):
        if max_blocks < 1:
            raise ValueError(f"the prefix index needs room for at least one block, got {max_blocks}")
        self.max_blocks = max_blocks
        self.sweep_slice = sweep_slice
        self.evicted = 0  # entries dropped for room
        self._entries: OrderedDict[int, int] = OrderedDict()  # block hash -> bits of the engines' tiers holding it
        self._anchor_of: dict[str, int] = {}  # engine id -> its group's lowest bit
        self._incarnation_of: dict[str, str] = {}
        self._live = 0  # groups of the engines in _anchor_of
        self._dead = 0  # groups of forgotten engines still set in some entries
        self._sweep: tuple[int, list[int], int] | None = None  # (bits being cleared, keys to visit, next key)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def engines(self) -> set[str]:
        return set(self._anchor_of)

    def apply(self, event: k25_pb2.KVEvents) -> None:
        """An engine's announcement: forget what it said before if it restarted or cleared,
        then drop what left its device, and add what a tier below holds and what it cached.
        An engine that announces no tiers below the device names none: its removed are gone."""
        with self._lock:
            if event.cleared or self._incarnation_of.get(event.engine_id, event.incarnation) != event.incarnation:
                self._forget(event.engine_id)
            anchor = self._anchor_for(event.engine_id, event.incarnation)
            group = _group(anchor)
            for h in event.removed:
                mask = self._entries.get(h)
                if mask is not None and mask & group:
                    if mask & ~group:
                        self._entries[h] = mask & ~group
                    else:
                        del self._entries[h]
            self._add(anchor << HOST_SHIFT, event.host)
            self._add(anchor << DISK_SHIFT, event.disk)
            self._add(anchor << DEVICE_SHIFT, event.stored)

    def record(self, engine_id: str, incarnation: str, hashes: Iterable[int]) -> None:
        """This gateway sent a prompt with these block hashes to the engine: it will hold them
        on its device (its own events confirm it, or take it back, shortly after)."""
        with self._lock:
            if self._incarnation_of.get(engine_id, incarnation) != incarnation:
                self._forget(engine_id)
            self._add(self._anchor_for(engine_id, incarnation) << DEVICE_SHIFT, hashes)

    def matched_blocks(self, hashes: list[int]) -> dict[str, HeldRun]:
        """For each engine that holds the first block of `hashes` in some tier, the blocks from
        the start it holds in one tier or another, counted by tier; the entries found become
        the most recently used."""
        matched: dict[str, HeldRun] = {}
        with self._lock:
            engine_of = {anchor: engine_id for engine_id, anchor in self._anchor_of.items()}
            live_anchors = sum(engine_of)
            below_device = live_anchors << HOST_SHIFT | live_anchors << DISK_SHIFT
            below: dict[int, list[int]] = {}  # anchor -> [host blocks, disk blocks] in its run so far
            alive = 0  # anchors of the engines holding every block so far
            for i, h in enumerate(hashes):
                mask = self._entries.get(h, 0)
                held = (mask | mask >> HOST_SHIFT | mask >> DISK_SHIFT) & (live_anchors if i == 0 else alive)
                if alive & ~held:
                    for anchor in _bits(alive & ~held):
                        matched[engine_of[anchor]] = _run(i, below.get(anchor))
                alive = held
                if not alive:
                    break
                self._entries.move_to_end(h)
                if mask & below_device:
                    for tier, shift in ((0, HOST_SHIFT), (1, DISK_SHIFT)):
                        for anchor in _bits((mask >> shift) & alive):
                            below.setdefault(anchor, [0, 0])[tier] += 1
            for anchor in _bits(alive):
                matched[engine_of[anchor]] = _run(len(hashes), below.get(anchor))
        return matched

    def retain(self, live: Mapping[str, str]) -> None:
        """Keep only engines that are live with the incarnation the registry shows (engine id -> incarnation)."""
        with self._lock:
            for engine_id in list(self._anchor_of):
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

    def _anchor_for(self, engine_id: str, incarnation: str) -> int:
        anchor = self._anchor_of.get(engine_id)
        if anchor is None:
            taken = self._live | self._dead
            anchor = 1
            while taken & _group(anchor):  # the lowest group neither an engine nor a pending sweep has
                anchor <<= GROUP_BITS
            self._anchor_of[engine_id] = anchor
            self._live |= _group(anchor)
        self._incarnation_of[engine_id] = incarnation
        return anchor

    def _add(self, tier_bit: int, hashes: Iterable[int]) -> None:
        """The engine of `tier_bit` holds `hashes` in that tier (and in no other of its group)."""
        entries = self._entries
        others = _group(_anchor_of_bit(tier_bit)) & ~tier_bit
        for h in hashes:
            entries[h] = entries.get(h, 0) & ~others | tier_bit
            entries.move_to_end(h)
        while len(entries) > self.max_blocks:
            entries.popitem(last=False)
            self.evicted += 1

    def _forget(self, engine_id: str) -> None:
        anchor = self._anchor_of.pop(engine_id, None)
        self._incarnation_of.pop(engine_id, None)
        if anchor is not None:
            self._live &= ~_group(anchor)
            self._dead |= _group(anchor)


def _group(anchor: int) -> int:
    return anchor * ((1 << GROUP_BITS) - 1)


def _anchor_of_bit(tier_bit: int) -> int:
    """The anchor of the group `tier_bit` (one bit) is in."""
    return 1 << (tier_bit.bit_length() - 1) // GROUP_BITS * GROUP_BITS


def _run(blocks: int, below: list[int] | None) -> HeldRun:
    host, disk = below or (0, 0)
    return HeldRun(blocks - host - disk, host, disk)


def _bits(mask: int) -> Iterable[int]:
    while mask:
        low = mask & -mask
        yield low
        mask ^= low
