"""Continuous batching with prefill slices under one token budget per step.

Each step: running sequences that are decoding get their one token first, then running
sequences part-way through their prompt get their next prefill slice, then waiting
sequences are admitted, fewest prompt tokens left to compute first
(engine/core/admission_order.py), while budget, sequence slots and KV blocks last (keeping one
free block per running sequence). A waiting sequence whose adapter would make more than
`max_loras` distinct adapters in the running batch gets no device slot this step: it is
passed over, keeps its place, and later ones go ahead.
When a running sequence needs a block and none is free, the most recent arrival is
preempted: its blocks are freed and it is recomputed later from its tokens.

A waiting sequence starts from the longest run of its full blocks found in the prefix
cache (engine/core/block_manager.py): those tokens are not computed again and cost no budget.
A preempted sequence finds its own blocks there again unless their space was needed.
A waiting sequence whose next uncached block a running sequence is computing now (a
second question about a document whose first is still being prefilled) waits, keeping its
place, and finds that block cached once it is: the same prompt is never prefilled twice
at once."""

import time
from dataclasses import dataclass, field

from engine.core.admission_order import ORDER_WINDOW, admission_order
from engine.core.block_manager import BlockManager
from engine.core.lower_tiers import DISK, HOST, LowerTiers
from engine.core.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    # (sequence, number of its tokens to compute this step), decodes first
    items: list[tuple[Sequence, int]] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)  # came from the waiting queue this step
    preempted: list[Sequence] = field(default_factory=list)
    offload: list[tuple[int, int]] = field(default_factory=list)  # (hash, device block) evicted: copy down first
    restore: list[tuple[int, int]] = field(default_factory=list)  # (hash, device block) to fill from host memory

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.items)


class Scheduler:
    def __init__(
        self, block_manager: BlockManager, max_num_batched_tokens: int, max_num_seqs: int, max_loras: int = 0,
        overtake_limit_s: float = 0.0, lower_tiers: LowerTiers | None = None,
    ):
        if max_num_batched_tokens < 1 or max_num_seqs < 1:
            raise ValueError("the token budget and the sequence limit must be at least 1")
        self.block_manager = block_manager
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_loras = max_loras
        self.overtake_limit_s = overtake_limit_s  # 0: first come, first served
        self.lower_tiers = lower_tiers if block_manager.prefix_caching else None
        block_manager.keep_evicted = self.lower_tiers is not None
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def running_adapter_ids(self) -> set[int]:
        """The adapters the running batch uses: each holds a device slot."""
        return {s.adapter.id for s in self.running if s.adapter is not None}

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def finish(self, seq: Sequence) -> None:
        """Remove a sequence (finished, aborted or failed) and free its blocks now."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.release(seq.block_table)
        self._release_fetched(seq)
        seq.status = SequenceStatus.FINISHED

    def mark_computed(self, seq: Sequence, n: int) -> None:
        """Record that a step computed `n` more tokens of `seq`, and offer the blocks they
        filled to the prefix cache."""
        seq.num_computed_tokens += n
        block_size = self.block_manager.block_size
        full = seq.num_computed_tokens // block_size
        if self.block_manager.prefix_caching and full > seq.cached_blocks:
            self.block_manager.cache_full_blocks(seq.block_table, seq.full_block_hashes(full, block_size), seq.cached_blocks)
            seq.cached_blocks = full

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        order = sorted(self.running, key=lambda s: (not s.is_decoding, s.arrival_order))
        for seq in order:
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:  # preempted earlier in this loop
                continue
            n = min(seq.num_uncomputed_tokens, budget)
            if not self._make_room(seq, n, batch):
                continue
            self.block_manager.grow(seq.block_table, seq.num_computed_tokens + n)
            batch.items.append((seq, n))
            budget -= n
        if not batch.preempted:
            self._admit(batch, self.max_num_batched_tokens - batch.num_tokens)
        if self.lower_tiers is not None:
            batch.offload = self.block_manager.take_evicted()
        return batch

    def _admit(self, batch: ScheduledBatch, budget: int) -> None:
        adapters = self.running_adapter_ids()
        prefilling = self._blocks_being_prefilled()
        for seq in self._admission_order():
            if budget <= 0 or len(self.running) >= self.max_num_seqs:
                break
            if seq.adapter is not None and seq.adapter.id not in adapters and len(adapters) >= self.max_loras:
                continue  # passed over for want of an adapter slot; keeps its place
            # looked up again, not taken from the ordering: admitting one sequence may evict blocks another found
            reuse = self._cached_prefix(seq)
            lower = self._lower_prefix(seq, len(reuse))
            if lower is None:
                continue  # its next blocks are being read from disk: it keeps its place
            if prefilling is not None and self._next_block_hash(seq, len(reuse) + len(lower)) in prefilling:
                continue  # a running sequence is computing it: found cached in a later step
            computed = seq.num_computed_tokens + (len(reuse) + len(lower)) * self.block_manager.block_size
            n = min(seq.num_tokens - computed, budget)
            # leave a block per running sequence for its next token: admitting into the last free
            # blocks would only have the newcomer preempted (and its work thrown away) next step
            if not self.block_manager.can_grow(seq.block_table, computed + n, keep_free=len(self.running), reuse=reuse):
                break
            self.waiting.remove(seq)
            if seq.adapter is not None:
                adapters.add(seq.adapter.id)
            self.block_manager.grow(seq.block_table, computed + n, reuse=reuse)
            self._count_lookup(seq, computed)
            if lower:
                self._restore(seq, len(reuse), lower, batch)
            self._release_fetched(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            batch.items.append((seq, n))
            batch.admitted.append(seq)
            budget -= n
            if prefilling is not None:
                prefilling.update(self._uncomputed_prompt_blocks(seq))

    def _admission_order(self) -> list[Sequence]:
        """The waiting sequences in the order to try them (engine/core/admission_order.py)."""
        if self.overtake_limit_s <= 0 or len(self.waiting) < 2:
            return list(self.waiting)
        window = self.waiting[:ORDER_WINDOW]
        now = time.monotonic()
        block_size = self.block_manager.block_size
        order = admission_order(
            [s.num_uncomputed_tokens - len(self._cached_prefix(s)) * block_size for s in window],
            [now - s.arrival_time for s in window],
            [s.preemptions > 0 for s in window],
            self.overtake_limit_s,
        )
        return [window[i] for i in order] + self.waiting[ORDER_WINDOW:]

    def _blocks_being_prefilled(self) -> set[int] | None:
        """The hashes of the full prompt blocks running sequences have yet to compute (None
        without prefix caching: nothing to wait for)."""
        if not self.block_manager.prefix_caching:
            return None
        return {h for seq in self.running if not seq.output_token_ids for h in self._uncomputed_prompt_blocks(seq)}

    def _uncomputed_prompt_blocks(self, seq: Sequence) -> list[int]:
        block_size = self.block_manager.block_size
        prompt_blocks = seq.full_block_hashes(len(seq.prompt_token_ids) // block_size, block_size)
        return prompt_blocks[seq.num_computed_tokens // block_size :]

    def _next_block_hash(self, seq: Sequence, cached_blocks: int) -> int | None:
        """The hash of the full block after a waiting sequence's cached prefix; None if it has none."""
        block_size = self.block_manager.block_size
        if cached_blocks >= (seq.num_tokens - 1) // block_size:
            return None
        return seq.full_block_hashes(cached_blocks + 1, block_size)[cached_blocks]

    def _cached_prefix(self, seq: Sequence) -> list[int]:
        """The cached blocks a waiting sequence can start from. Its last token is always
        computed (its logits give the next token), so only blocks before it count."""
        if not self.block_manager.prefix_caching or seq.block_table:
            return []
        block_size = self.block_manager.block_size
        return self.block_manager.cached_prefix(seq.full_block_hashes((seq.num_tokens - 1) // block_size, block_size))

    def _lower_prefix(self, seq: Sequence, start: int) -> list[int] | None:
        """The hashes of the blocks after its first `start` (device-cached) ones that host memory
        holds, or None while it waits for disk reads (or for host memory to have room for them:
        the blocks waiting sequences fetched stay there until they are admitted). A sequence
        waits for the disk once: a block that could not be read, and the ones after it, it
        computes rather than wait again."""
        if self.lower_tiers is None or seq.block_table:
            return []
        block_size = self.block_manager.block_size
        hashes = seq.full_block_hashes((seq.num_tokens - 1) // block_size, block_size)[start:]
        tiers = self.lower_tiers.find(hashes)
        if not seq.disk_fetched:
            on_disk = [h for h, tier in zip(hashes, tiers) if tier == DISK]
            if on_disk:
                if self.lower_tiers.fetch(hashes[: len(tiers)]):
                    seq.disk_fetched.update(on_disk)
                    seq.tier_held.update(hashes[: len(tiers)])
                return None  # its reads started, or it asks again once host memory has room for them
        elif self.lower_tiers.reading_any(seq.disk_fetched):
            return None
        host_run = next((i for i, tier in enumerate(tiers) if tier != HOST), len(tiers))
        return hashes[:host_run]

    def _release_fetched(self, seq: Sequence) -> None:
        if self.lower_tiers is not None and seq.tier_held:
            self.lower_tiers.release(seq.tier_held)
            seq.tier_held.clear()

    def _restore(self, seq: Sequence, start: int, hashes: list[int], batch: ScheduledBatch) -> None:
        """Have the blocks after its device-cached prefix filled from host memory. They join the
        device's prefix cache once the step that fills them has run (mark_computed)."""
        batch.restore += zip(hashes, seq.block_table[start : start + len(hashes)])
        seq.cached_blocks = start
        stats = self.lower_tiers.stats
        block_size = self.block_manager.block_size
        tokens, disk_tokens = len(hashes) * block_size, sum(h in seq.disk_fetched for h in hashes) * block_size
        stats.host_hit_tokens += tokens
        stats.disk_hit_tokens += disk_tokens
        if seq.preemptions == 0:  # as num_cached_tokens: what its first admission found
            seq.host_cached_tokens, seq.disk_cached_tokens = tokens - disk_tokens, disk_tokens

    def _count_lookup(self, seq: Sequence, computed: int) -> None:
        seq.num_computed_tokens = computed
        seq.cached_blocks = computed // self.block_manager.block_size
        if self.block_manager.prefix_caching:
            self.block_manager.record_lookup(seq.num_tokens, computed)
        if seq.preemptions == 0:  # what the response reports: the prompt found cached on its first admission
            seq.num_cached_tokens = computed

    def _make_room(self, seq: Sequence, n: int, batch: ScheduledBatch) -> bool:
        """Preempt later arrivals until `seq` can grow by `n` tokens; False if `seq` itself was preempted."""
        while not self.block_manager.can_grow(seq.block_table, seq.num_computed_tokens + n):
            victim = max(self.running, key=lambda s: s.arrival_order)
            self._preempt(victim, batch)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence, batch: ScheduledBatch) -> None:
        batch.items = [(s, n) for s, n in batch.items if s is not seq]
        self.running.remove(seq)
        self.block_manager.release(seq.block_table)
        seq.num_computed_tokens = 0
        seq.cached_blocks = 0
        seq.status = SequenceStatus.WAITING
        seq.preemptions += 1
        self.waiting.insert(0, seq)
        batch.preempted.append(seq)
