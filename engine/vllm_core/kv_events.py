"""vLLM's prefix-cache changes as K25's: the gateway's prefix index knows blocks by K25's chained
hash (common/prefix_hash.py) over blocks of the engine's block_size, so this backend
translates, and the gateway keeps no knowledge of either backend's internals.

A request's prompt blocks are announced stored when its prefill is done: K25's chain over its
prompt (seeded by its adapter and salt), paired block by block with vLLM's hashes of the same
blocks. vLLM reports evictions (BlockRemoved, AllBlocksCleared) by its own hashes; the pairing
turns them back into K25's. A block vLLM hashes alike for two requests is one block to both.
vLLM keeps blocks on the device only: a block it evicts is held nowhere."""

from collections.abc import Sequence

from common.prefix_hash import cache_seed, chain_block_hashes
from engine.core.contract import DEVICE


class KVEventTranslator:
    def __init__(self, block_size: int):
        self.block_size = block_size
        self.enabled = False
        self._k25_of: dict[object, int] = {}  # vLLM's hash of a cached block -> K25's
        self._changes: dict[int, str | None] = {}  # K25's hash -> DEVICE, or None once evicted

    def prompt_cached(self, prompt: Sequence[int], adapter: str, salt: str, vllm_hashes: Sequence[object]) -> None:
        """The full blocks of `prompt` are in vLLM's cache under `vllm_hashes` (first to last)."""
        ours = chain_block_hashes(prompt, self.block_size, cache_seed(adapter, salt))
        for k25_hash, vllm_hash in zip(ours, vllm_hashes):
            if vllm_hash not in self._k25_of:
                self._k25_of[vllm_hash] = k25_hash
                if self.enabled:
                    self._changes[k25_hash] = DEVICE

    def evicted(self, vllm_hashes: Sequence[object]) -> None:
        for vllm_hash in vllm_hashes:
            k25_hash = self._k25_of.pop(vllm_hash, None)
            if k25_hash is not None and self.enabled:
                self._changes[k25_hash] = None

    def cleared(self) -> None:
        self.evicted(list(self._k25_of))

    def take(self) -> dict[int, str | None]:
        """The changes since the last take (StepResult.kv_events); nothing while announcing is off."""
        taken, self._changes = self._changes, {}
        return taken


class EvictionCollector:
    """Takes the place of vLLM's KV event publisher (its scheduler publishes each step's batch)
    and hands the evictions to the translator."""

    def __init__(self, translator: KVEventTranslator):
        self.translator = translator

    def publish(self, batch) -> None:
        for event in batch.events:
            kind = type(event).__name__
            if kind == "BlockRemoved":
                self.translator.evicted(event.block_hashes)
            elif kind == "AllBlocksCleared":
                self.translator.cleared()

    def shutdown(self) -> None:
        pass
