"""The tiers below the device, as the scheduler sees them (engine/core/lower_tiers.py): a bounded
pool of blocks in host memory (pinned on CUDA) in front of an optional bounded disk directory.

Host memory holds copies of blocks the device evicted (a block back on the device may keep its
host copy, so evicting it again copies nothing); every block copied down is also written through
to disk by the disk tier's worker thread, so the disk holds what host memory gave up and what a
restart would lose. Blocks read from disk land in host memory, then go to the device like any
host block.

Where copies run: on CUDA, device-to-host copies run on a copy stream from a gathered device
buffer (the forward only waits for the gather) and reach the host index once their event has
completed; host-to-device copies of restored blocks run on the step's stream right before its
forward. On a CPU engine "device" and host are the same memory, so both are memory copies on the
engine thread; disk reads and writes run on the disk tier's thread everywhere."""

import logging
import time
from collections import Counter

import torch

from engine.attention.kv_cache import KVCache
from engine.core.lower_tiers import DISK, HOST, TierStats
from engine.core.tier_policy import ScoreWeights, TierIndex
from engine.kv_tiers.block_copy import block_shape, gather_blocks, scatter_blocks
from engine.kv_tiers.disk_tier import DiskTier

log = logging.getLogger(__name__)


class TierStore:
    def __init__(self, kv: KVCache, block_size: int, host_blocks: int, weights: ScoreWeights, disk: DiskTier | None = None):
        self.kv = kv
        self.block_size = block_size
        self.device = kv.k[0].device
        self.cuda = self.device.type == "cuda"
        self.dtype = kv.k[0].dtype
        self.shape = block_shape(kv, block_size)
        self.block_bytes = self.dtype.itemsize * int(torch.Size(self.shape).numel())
        self.host = TierIndex(host_blocks, weights)
        self.pool = torch.empty((host_blocks, *self.shape), dtype=self.dtype, pin_memory=self.cuda)
        self.disk = disk
        self.stats = TierStats()
        self._copy_stream = torch.cuda.Stream(self.device) if self.cuda else None
        self._in_flight: list[tuple[list[int], torch.Tensor, object]] = []  # (keys, host copy, CUDA event or None)
        self._in_flight_keys: set[int] = set()
        # the keys waiting requests fetched (how many requests each), and those of them pinned in host memory
        # until the last of those requests goes (release); at most the host pool's size, so every read lands
        self._wanted: Counter[int] = Counter()
        self._landed: set[int] = set()

    # --- what the scheduler asks (engine/core/lower_tiers.py) ----------------------------

    def find(self, hashes: list[int]) -> list[str]:
        tiers = []
        for h in hashes:
            tier = self.tier_of(h)
            if tier is None:
                break
            tiers.append(tier)
        return tiers

    def fetch(self, hashes: list[int]) -> bool:
        if self._wanted and len(self._wanted.keys() | set(hashes)) > self.host.capacity:
            return False
        for h in hashes:
            self._wanted[h] += 1
            if h in self.host:
                self._hold(h)
            else:
                self.disk.read(h)
        return True

    def _hold(self, key: int) -> None:
        if key not in self._landed:
            self.host.pin(key)
            self._landed.add(key)

    @property
    def reading(self) -> int:
        return self.disk.reading if self.disk is not None else 0

    def reading_any(self, hashes: set[int]) -> bool:
        return self.disk is not None and self.disk.reading_any(hashes)

    def poll(self, timeout: float = 0.0) -> None:
        self._settle_offloads()
        if self.disk is None:
            return
        now = time.time()
        for key, payload in self.disk.poll(now, timeout):
            if payload is None:
                self.stats.dropped_blocks += 1
                continue
            self.stats.bytes_from_disk += len(payload)
            data = torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(self.dtype).view(self.shape)
            if self._store_host(key, data, now) and key in self._wanted:
                self._hold(key)  # read for a waiting request: kept until it is admitted (release)

    def release(self, hashes: set[int]) -> None:
        for key in hashes & self._wanted.keys():
            self._wanted[key] -= 1
            if self._wanted[key] == 0:
                del self._wanted[key]
                if key in self._landed:
                    self._landed.discard(key)
                    self.host.unpin(key)

    def tier_blocks(self) -> dict[str, tuple[int, int]]:
        tiers = {HOST: (len(self.host), len(self.host) * self.block_bytes)}
        if self.disk is not None:
            tiers[DISK] = (len(self.disk.index), len(self.disk.index) * self.block_bytes)
        return tiers

    def tier_of(self, key: int) -> str | None:
        if key in self.host:
            return HOST
        return DISK if self.disk is not None and key in self.disk else None

    def watch(self, enabled: bool) -> None:
        changed = None
        if enabled:
            changed = set(self.host.keys()) | set(self.disk.index.keys() if self.disk is not None else ())
        self.host.changed = changed  # one set for both tiers
        if self.disk is not None:
            self.disk.index.changed = changed

    def take_changed(self) -> set[int]:
        changed = self.host.changed
        if not changed:
            return set()
        taken = set(changed)
        changed.clear()
        return taken

    # --- copies, called by the model runner before a step's forward ---------------------

    def apply(self, offload: list[tuple[int, int]], restore: list[tuple[int, int]]) -> None:
        """Copy the evicted device blocks `offload` (hash, block) down, then the host blocks
        `restore` (hash, device block) up: the same device block may be in both lists."""
        started = time.perf_counter()
        now = time.time()
        for h, _ in restore:  # not given up to make room for what this step copies down
            self.host.pin(h)
        try:
            self._offload([(h, b) for h, b in offload if h not in self.host and h not in self._in_flight_keys], now)
            if restore:
                self._restore(restore, now)
        finally:
            for h, _ in restore:
                self.host.unpin(h)
        self.stats.copy_seconds += time.perf_counter() - started

    def close(self, device_blocks: list[tuple[int, int]] = ()) -> None:
        if self.disk is not None:
            self._offload([(h, b) for h, b in device_blocks if self.tier_of(h) is None and h not in self._in_flight_keys],
                          time.time())
        if self._copy_stream is not None:
            self._copy_stream.synchronize()
        self._settle_offloads()
        if self.disk is not None:
            self.disk.close()

    def _offload(self, evicted: list[tuple[int, int]], now: float) -> None:
        if not evicted:
            return
        keys = [h for h, _ in evicted]
        data = gather_blocks(self.kv, [b for _, b in evicted], self.block_size)  # ordered before the forward
        event = None
        if self.cuda:
            staging = torch.empty(data.shape, dtype=self.dtype, pin_memory=True)
            self._copy_stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self._copy_stream):
                staging.copy_(data, non_blocking=True)
                data.record_stream(self._copy_stream)
                event = torch.cuda.Event()
                event.record(self._copy_stream)
            data = staging
        self._in_flight.append((keys, data, event))
        self._in_flight_keys.update(keys)
        self.stats.offloaded_blocks += len(keys)
        self.stats.bytes_to_host += len(keys) * self.block_bytes
        self._settle_offloads()

    def _settle_offloads(self) -> None:
        """Blocks whose copy down has completed enter host memory and are written through to disk."""
        now = time.time()
        while self._in_flight and (self._in_flight[0][2] is None or self._in_flight[0][2].query()):
            keys, data, _ = self._in_flight.pop(0)
            self._in_flight_keys.difference_update(keys)
            for i, key in enumerate(keys):
                self._store_host(key, data[i], now)
                if self.disk is not None:
                    self.disk.write(key, data[i].contiguous().view(torch.uint8).numpy().tobytes(), now)
                    self.stats.bytes_to_disk += self.block_bytes

    def _store_host(self, key: int, data: torch.Tensor, now: float) -> bool:
        added = self.host.add(key, now)
        if added is not None:
            self.pool[added[0]].copy_(data)
        return added is not None

    def _restore(self, restore: list[tuple[int, int]], now: float) -> None:
        slots = torch.tensor([self.host.get(h).slot for h, _ in restore], dtype=torch.int64)
        for h, _ in restore:
            self.host.touch(h, now)
        data = self.pool.index_select(0, slots)
        if self.cuda:
            data = data.pin_memory().to(self.device, non_blocking=True)
        scatter_blocks(self.kv, [b for _, b in restore], self.block_size, data)
        self.stats.restored_blocks += len(restore)
        self.stats.bytes_to_device += len(restore) * self.block_bytes
