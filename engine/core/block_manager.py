"""Paged KV-cache bookkeeping: which fixed-size blocks each sequence holds, and which full
blocks are cached for reuse by their prefix hash (common/prefix_hash.py).

Pure Python, no tensors: a block table is a list of block ids, block `i` of a table holds
the KV of token positions [i * block_size, (i + 1) * block_size).

Every block is either in use (held by one or more sequences: a reference count) or free.
A free block may still hold a cached prefix: it is reclaimable, taken only when no
uncached free block is left, least recently released first (LRU). A block joins the cache
once its sequence has computed all of it (`cache_full_blocks`); a later sequence whose
prompt starts with the same hashes takes those blocks instead of computing them
(`cached_prefix`, then `grow(..., reuse=...)`). Writes never reach a shared block: only
full blocks are shared, and a sequence writes only past what it has computed."""

from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class PrefixCacheStats:
    """Counters since the engine started."""

    queried_tokens: int = 0  # prompt tokens looked up in the cache on admission
    hit_tokens: int = 0  # ... of which were found cached
    evicted_blocks: int = 0  # cached blocks taken for new KV


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one token, got {num_blocks} x {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self._refs = [0] * num_blocks
        # free blocks in the order they are taken: uncached ones first, then cached ones, least recently released first
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._hash_of: dict[int, int] = {}  # block -> the prefix hash it is cached under
        self._block_of: dict[int, int] = {}  # prefix hash -> its block
        self.stats = PrefixCacheStats()
        # cache changes not yet taken by take_events(), kept only once someone takes them
        self.events_enabled = False
        self._stored: list[int] = []
        self._removed: list[int] = []
        # cached blocks taken for new KV, as (hash, block), kept only while lower KV tiers take them
        self.keep_evicted = False
        self._evicted: list[tuple[int, int]] = []

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence uses, reclaimable cached ones included."""
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._block_of)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, 0..1; cached blocks no sequence uses do not count."""
        return 1.0 - len(self._free) / self.num_blocks

    def ref_count(self, block: int) -> int:
        """How many block tables hold `block` now."""
        return self._refs[block]

    def holds(self, h: int) -> bool:
        """Whether a block is cached under prefix hash `h`."""
        return h in self._block_of

    def cached_blocks(self) -> list[tuple[int, int]]:
        """Every cached block, as (prefix hash, block)."""
        return [(h, block) for block, h in self._hash_of.items()]

    def cached_hash(self, block: int) -> int | None:
        """The prefix hash `block` is cached under, if any."""
        return self._hash_of.get(block)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def cached_prefix(self, hashes: list[int]) -> list[int]:
        """The blocks holding the longest cached run of `hashes` from its start."""
        blocks = []
        if self.prefix_caching:
            for h in hashes:
                block = self._block_of.get(h)
                if block is None:
                    break
                blocks.append(block)
        return blocks

    def record_lookup(self, queried_tokens: int, hit_tokens: int) -> None:
        self.stats.queried_tokens += queried_tokens
        self.stats.hit_tokens += hit_tokens

    def can_grow(self, block_table: list[int], num_tokens: int, keep_free: int = 0, reuse: list[int] = ()) -> bool:
        """Whether `block_table`, extended by the cached blocks `reuse`, can cover `num_tokens`
        and still leave `keep_free` blocks free."""
        missing = self.blocks_for(num_tokens) - len(block_table) - len(reuse)
        reclaimed = sum(1 for block in reuse if block in self._free)  # taken out of the free list by reuse
        return missing <= len(self._free) - reclaimed - keep_free

    def grow(self, block_table: list[int], num_tokens: int, reuse: list[int] = ()) -> None:
        """Extend `block_table` in place: first with the cached blocks `reuse` (shared, not
        copied), then with new blocks until it covers `num_tokens` positions."""
        if not self.can_grow(block_table, num_tokens, reuse=reuse):
            raise RuntimeError(f"cannot cover {num_tokens} tokens with {len(self._free)} free blocks; call can_grow first")
        for block in reuse:
            self._free.pop(block, None)
            self._refs[block] += 1
            block_table.append(block)
        for _ in range(self.blocks_for(num_tokens) - len(block_table)):
            block, _ = self._free.popitem(last=False)
            self._forget(block)
            self._refs[block] = 1
            block_table.append(block)

    def cache_full_blocks(self, block_table: list[int], hashes: list[int], start: int) -> None:
        """Offer blocks [start, len(hashes)) of `block_table`, whose KV is all computed, to the
        cache under `hashes`. A hash another block already holds keeps that block."""
        if not self.prefix_caching:
            return
        for i in range(start, len(hashes)):
            block, h = block_table[i], hashes[i]
            if block in self._hash_of or h in self._block_of:
                continue
            self._hash_of[block] = h
            self._block_of[h] = block
            if self.events_enabled:
                self._stored.append(h)

    def release(self, block_table: list[int]) -> None:
        """Give up every block of `block_table` and empty it. A block no sequence uses any
        more becomes free; cached ones stay findable until their space is needed, the
        table's later blocks taken first (a prefix's tail is shared least)."""
        for block in reversed(block_table):
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._free[block] = None
                if block not in self._hash_of:
                    self._free.move_to_end(block, last=False)
        block_table.clear()

    def take_events(self) -> tuple[list[int], list[int]]:
        """The hashes cached and the hashes evicted since the last call."""
        events = self._stored, self._removed
        self._stored, self._removed = [], []
        return events

    def take_evicted(self) -> list[tuple[int, int]]:
        """The cached blocks taken for new KV since the last call, as (hash, block): their KV is
        intact until the next forward writes there, so it can be copied down a tier first."""
        evicted, self._evicted = self._evicted, []
        return evicted

    def slot(self, block_table: list[int], position: int) -> int:
        """Row of the flat KV tensor that holds `position` of this sequence."""
        return block_table[position // self.block_size] * self.block_size + position % self.block_size

    def _forget(self, block: int) -> None:
        h = self._hash_of.pop(block, None)
        if h is not None:
            del self._block_of[h]
            if self.events_enabled:
                self._removed.append(h)
            if self.keep_evicted:
                self._evicted.append((h, block))
            self.stats.evicted_blocks += 1
