"""The adapters one engine serves: registered by name@version, their weights cached on the
CPU (at most max_cpu_loras) and copied into the device slots (at most max_loras) while
requests use them.

An adapter is in use while a request for it is in the running batch: its slot and its CPU
copy are never given up then; otherwise the least recently used goes first. The scheduler
keeps at most max_loras adapters in the running batch, so an adapter it admits always finds
a slot. Weights dropped from the CPU cache are read from disk again when a request needs
them, and must hash to what was first loaded. Not thread-safe: the engine's thread calls it,
except `read`, which touches none of its state: another thread reads, hashes and parses an
adapter's files with it, so that the engine's thread only registers the result."""

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from engine.base.errors import EngineError, ErrorCode
from engine.base.model_config import ModelConfig
from engine.lora.adapter import AdapterRef, AdapterWeights, LoadedAdapter
from engine.lora.eviction import least_recent_idle
from engine.lora.peft_format import parse_peft_adapter
from engine.lora.slots import LoRASlots
from engine.lora.source import parse_checksum, read_adapter_files, read_checked_files

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReadAdapter:
    """An adapter's files read, checked and parsed, not yet registered."""

    ref: AdapterRef
    path: str
    sha256: str
    weights: AdapterWeights


class AdapterManager:
    def __init__(
        self,
        slots: LoRASlots | None,  # None: adapters are off
        model_config: ModelConfig,
        root: str | None,
        max_cpu_loras: int,
        in_use: Callable[[], set[int]],  # ids of the adapters the running batch uses
    ):
        self.slots = slots
        self.model_config = model_config
        self.root = root
        self.max_cpu_loras = max_cpu_loras
        self._in_use = in_use
        self._registered: dict[str, LoadedAdapter] = {}
        self._cpu: OrderedDict[int, AdapterWeights] = OrderedDict()  # least recently used first
        num_slots = slots.num_slots if slots is not None else 0
        self._slot_owner: list[LoadedAdapter | None] = [None] * num_slots
        self._slot_lru: list[int] = list(range(num_slots))  # least recently used first
        self.disk_reads = 0
        self.slot_writes = 0

    @property
    def keys(self) -> list[str]:
        """name@version of every adapter requests may ask for."""
        return sorted(self._registered)

    def get(self, ref: AdapterRef) -> LoadedAdapter:
        adapter = self._registered.get(ref.key)
        if adapter is None:
            raise EngineError(
                ErrorCode.ADAPTER_NOT_FOUND, f"adapter {ref.name!r} version {ref.version!r} is not loaded on this engine"
            )
        return adapter

    # --- load and unload --------------------------------------------------------------------

    def load(self, ref: AdapterRef, path: str, checksum: str | None = None) -> LoadedAdapter:
        """Read, check and register an adapter (and fill a free slot with it); loading the same
        files under the same name@version again is a no-op."""
        existing = self._registered.get(ref.key)
        if existing is not None:
            if existing.path == path and (not checksum or parse_checksum(checksum) == existing.sha256):
                return existing
            raise _already_loaded(existing)
        return self.register(self.read(ref, path, checksum))

    def read(self, ref: AdapterRef, path: str, checksum: str | None = None) -> ReadAdapter:
        """Read an adapter's files, check their checksum and parse them; changes nothing here, so
        any thread may call it."""
        ref.validate()
        if self.slots is None:
            raise EngineError(ErrorCode.INVALID_ARGUMENT, "LoRA adapters are off on this engine (max_loras=0)")
        files = read_checked_files(self.root, ref.key, path, checksum)
        return ReadAdapter(ref, path, files.sha256, parse_peft_adapter(files, self.model_config, self.slots.max_rank))

    def register(self, read: ReadAdapter) -> LoadedAdapter:
        """Make an adapter that `read` returned servable (and fill a free slot with it); the same
        files under the same name@version again are a no-op."""
        ref, weights = read.ref, read.weights
        existing = self._registered.get(ref.key)
        if existing is not None:
            if existing.path == read.path and existing.sha256 == read.sha256:
                return existing
            raise _already_loaded(existing)
        self.disk_reads += 1
        adapter = LoadedAdapter(ref, read.path, read.sha256, weights.rank, tuple(sorted({m for _, m in weights.matrices})))
        self._registered[ref.key] = adapter
        self._cache(adapter, weights)
        if None in self._slot_owner:  # ready before its first request
            self._write_slot(self._slot_owner.index(None), adapter, weights)
        log.info("loaded adapter %s from %s (rank %d, %s)", ref.key, read.path, adapter.rank, ", ".join(adapter.modules))
        return adapter

    def unload(self, ref: AdapterRef) -> bool:
        """Stop accepting requests for it; those already admitted finish on its weights.
        False if it was not loaded."""
        adapter = self._registered.pop(ref.key, None)
        if adapter is None:
            return False
        self._cpu.pop(adapter.id, None)
        if adapter.id not in self._in_use():
            self._slot_owner = [None if owner is adapter else owner for owner in self._slot_owner]
        log.info("unloaded adapter %s", ref.key)
        return True

    # --- slots ------------------------------------------------------------------------------

    def slot_for(self, adapter: LoadedAdapter) -> int:
        """The slot that holds `adapter`, filled now if needed, for a request the scheduler admitted.
        Raises ADAPTER_NOT_FOUND (and unregisters it) if its files can no longer be read."""
        slot = next((s for s, owner in enumerate(self._slot_owner) if owner is adapter), None)
        if slot is None:
            busy_ids = self._in_use()
            busy = {s for s, owner in enumerate(self._slot_owner) if owner is not None and owner.id in busy_ids}
            slot = least_recent_idle(sorted(self._slot_lru, key=self._reuse_order), busy)
            if slot is None:
                raise RuntimeError(f"every LoRA slot is in use: more than {len(self._slot_owner)} adapters were admitted")
            self._write_slot(slot, adapter, self._weights(adapter))
        self._slot_lru.remove(slot)
        self._slot_lru.append(slot)
        return slot

    def _reuse_order(self, slot: int) -> int:
        """Empty slots first, then those of unloaded adapters, then the rest (stable: LRU order)."""
        owner = self._slot_owner[slot]
        if owner is None:
            return 0
        return 1 if self._registered.get(owner.ref.key) is not owner else 2

    def _write_slot(self, slot: int, adapter: LoadedAdapter, weights: AdapterWeights) -> None:
        self.slots.write(slot, weights)
        self._slot_owner[slot] = adapter
        self._slot_lru.remove(slot)
        self._slot_lru.append(slot)
        self.slot_writes += 1

    # --- the CPU cache ----------------------------------------------------------------------

    def _weights(self, adapter: LoadedAdapter) -> AdapterWeights:
        weights = self._cpu.get(adapter.id)
        if weights is not None:
            self._cpu.move_to_end(adapter.id)
            return weights
        try:
            files = read_adapter_files(self.root, adapter.path)
            if files.sha256 != adapter.sha256:
                raise EngineError(ErrorCode.ADAPTER_NOT_FOUND, f"its files changed on disk (sha256 now {files.sha256})")
            weights = parse_peft_adapter(files, self.model_config, self.slots.max_rank)
        except EngineError as error:
            if self._registered.get(adapter.ref.key) is adapter:
                del self._registered[adapter.ref.key]
            log.warning("adapter %s unloaded: cannot read it again: %s", adapter.ref.key, error.message)
            raise EngineError(
                ErrorCode.ADAPTER_NOT_FOUND,
                f"adapter {adapter.ref.key} could not be read again from {adapter.path!r} and was unloaded: {error.message}",
            ) from None
        self.disk_reads += 1
        self._cache(adapter, weights)
        return weights

    def _cache(self, adapter: LoadedAdapter, weights: AdapterWeights) -> None:
        self._cpu[adapter.id] = weights
        self._cpu.move_to_end(adapter.id)
        busy = self._in_use()
        while len(self._cpu) > self.max_cpu_loras:
            victim = least_recent_idle(self._cpu, busy)
            if victim is None:
                break
            del self._cpu[victim]


def _already_loaded(existing: LoadedAdapter) -> EngineError:
    return EngineError(
        ErrorCode.INVALID_ARGUMENT,
        f"adapter {existing.ref.key} is already loaded from {existing.path!r} (sha256 {existing.sha256}); "
        "unload it before loading other files under the same version",
    )
