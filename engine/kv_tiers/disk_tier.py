"""The disk tier: a bounded directory of block files (engine/kv_tiers/block_file.py), one folder
per tier namespace, read and written by one worker thread so that no engine step waits on I/O.

The engine thread owns the index; the worker only moves bytes and reports back through a queue
that `poll` drains between steps. A write that fails (disk full, a read-only path) is logged and
the block simply is not on disk; a read that fails (truncated, flipped, vanished) drops the file,
and the request computes those tokens instead. Files found at start are indexed again: the
tier survives an engine restart."""

import logging
import os
import queue
import threading
import time
from dataclasses import dataclass

from engine.core.tier_policy import ScoreWeights, TierIndex
from engine.kv_tiers.block_file import SUFFIX, BlockFileError, block_file_name, read_block_file, write_block_file

log = logging.getLogger(__name__)


class DiskTierError(Exception):
    """The directory cannot serve as a tier (not creatable, not writable)."""


@dataclass
class DiskTierStats:
    written_blocks: int = 0
    write_errors: int = 0
    read_blocks: int = 0
    read_errors: int = 0  # bad checksum, truncated, I/O error: dropped and recomputed
    found_at_start: int = 0


class DiskTier:
    def __init__(self, root: str, namespace: int, block_bytes: int, capacity_blocks: int, weights: ScoreWeights, now: float):
        self.namespace = namespace
        self.block_bytes = block_bytes
        self.dir = os.path.join(root, f"{namespace:016x}")
        try:
            os.makedirs(self.dir, exist_ok=True)
            probe = os.path.join(self.dir, ".probe")
            with open(probe, "wb") as f:
                f.write(b"k25")
            os.unlink(probe)
        except OSError as exc:
            raise DiskTierError(f"KV disk tier {root!r} is not writable: {exc}") from None
        self.index = TierIndex(capacity_blocks, weights)
        self.stats = DiskTierStats()
        self._pending_writes: set[int] = set()
        self._pending_reads: set[int] = set()
        self._ops: queue.Queue = queue.Queue()
        self._results: queue.Queue = queue.Queue()
        self._scan(now)
        self._thread = threading.Thread(target=self._work, name="kv-disk-tier", daemon=True)
        self._thread.start()

    def path(self, key: int) -> str:
        return os.path.join(self.dir, block_file_name(key))

    def __contains__(self, key: int) -> bool:
        return key in self.index

    @property
    def reading(self) -> int:
        return len(self._pending_reads)

    def reading_any(self, keys: set[int]) -> bool:
        return not self._pending_reads.isdisjoint(keys)

    def write(self, key: int, payload: bytes, now: float) -> None:
        """Queue `payload` to be written as `key`'s file (a key already stored is only touched)."""
        if key in self.index:
            self.index.touch(key, now)
        elif key not in self._pending_writes:
            self._pending_writes.add(key)
            self._ops.put(("write", key, payload))

    def read(self, key: int) -> None:
        """Queue a read of `key`; `poll` hands back its payload, or None if it could not be read."""
        if key in self._pending_reads or key not in self.index:
            return
        self.index.pin(key)  # not given up while it is being read
        self._pending_reads.add(key)
        self._ops.put(("read", key, None))

    def poll(self, now: float, timeout: float = 0.0) -> list[tuple[int, bytes | None]]:
        """Apply what the worker finished; the reads among it as (key, payload or None). With a
        timeout, wait that long for the first result."""
        reads = []
        block = timeout > 0
        while True:
            try:
                result = self._results.get(block=block, timeout=timeout if block else None)
            except queue.Empty:
                return reads
            block = False
            kind, key, value = result
            if kind == "write":
                self._written(key, value, now)
            else:
                self._pending_reads.discard(key)
                self.index.unpin(key)
                if value is None:
                    self.index.remove(key)
                    self._ops.put(("delete", key, None))
                else:
                    self.index.touch(key, now)
                reads.append((key, value))

    def close(self) -> None:
        """Take in the reads and writes under way (the index then names every file written),
        let the worker delete what they displaced, and stop it."""
        while (self._pending_writes or self._pending_reads) and self._thread.is_alive():
            self.poll(time.time(), timeout=0.1)
        self._ops.put(None)
        self._thread.join()

    def _written(self, key: int, error: str | None, now: float) -> None:
        self._pending_writes.discard(key)
        if error is not None:
            self.stats.write_errors += 1
            log.warning("KV disk tier: block %016x not written (%s); it will be computed again when needed", key, error)
            return
        self.stats.written_blocks += 1
        added = self.index.add(key, now)
        if added is None:  # every block on disk is being read: this one does not stay
            self._ops.put(("delete", key, None))
            return
        for victim in added[1]:
            self._ops.put(("delete", victim, None))

    def _scan(self, now: float) -> None:
        """Index the block files a previous run left (their age from the file's time)."""
        found = []
        for name in os.listdir(self.dir):
            path = os.path.join(self.dir, name)
            if name.endswith(".tmp"):
                os.unlink(path)
            elif name.endswith(SUFFIX):
                try:
                    found.append((os.path.getmtime(path), int(name[: -len(SUFFIX)], 16)))
                except (OSError, ValueError):
                    continue
        for mtime, key in sorted(found):
            added = self.index.add(key, min(mtime, now))
            for victim in added[1] if added else [key]:
                os.unlink(self.path(victim))
        self.stats.found_at_start = len(self.index)

    def _work(self) -> None:
        while (op := self._ops.get()) is not None:
            kind, key, payload = op
            path = self.path(key)
            if kind == "write":
                try:
                    write_block_file(path, self.namespace, key, payload)
                    self._results.put(("write", key, None))
                except OSError as exc:
                    self._results.put(("write", key, str(exc)))
            elif kind == "read":
                try:
                    data = read_block_file(path, self.namespace, key, self.block_bytes)
                    self.stats.read_blocks += 1
                except (BlockFileError, OSError, MemoryError) as exc:
                    log.warning("KV disk tier: dropping block %016x (%s); it will be computed again", key, exc)
                    self.stats.read_errors += 1
                    data = None
                self._results.put(("read", key, data))
            else:
                try:
                    os.unlink(path)
                except OSError:
                    pass
