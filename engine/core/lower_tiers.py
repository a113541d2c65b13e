"""What the scheduler needs of the KV tiers below the device (engine/kv_tiers/store.py): where
the blocks after a prompt's device-cached prefix are, and a way to have disk blocks read into
host memory without waiting for them. Each full prefix block the device evicts is handed down
(ScheduledBatch.offload); blocks found in host memory are copied into new device blocks before
the step's forward (ScheduledBatch.restore). A request whose blocks are on disk waits, keeping
its place, until they are in host memory (or found unreadable: then it computes them); the rest
of the batch does not wait."""

from dataclasses import dataclass
from typing import Protocol

# the tiers, highest first: where the KV events say a prefix block is (engine/core/contract.py)
DEVICE = "device"
HOST = "host"
DISK = "disk"


@dataclass
class TierStats:
    """Counters since the engine started (k25_engine_kv_tier_* metrics)."""

    host_hit_tokens: int = 0  # prompt tokens brought back from host memory instead of computed
    disk_hit_tokens: int = 0  # ... of which were read from disk first
    offloaded_blocks: int = 0  # device blocks copied down to host memory
    restored_blocks: int = 0  # host blocks copied back to the device
    bytes_to_host: int = 0
    bytes_to_device: int = 0
    bytes_to_disk: int = 0
    bytes_from_disk: int = 0
    dropped_blocks: int = 0  # stored blocks found unreadable (bad checksum, truncated, I/O error) and dropped
    copy_seconds: float = 0.0  # time the engine thread spent issuing copies between tiers


class LowerTiers(Protocol):
    stats: TierStats

    def find(self, hashes: list[int]) -> list[str]:
        """The tier (HOST or DISK) of each of the leading `hashes` held below the device; stops
        at the first one held nowhere."""

    def fetch(self, hashes: list[int]) -> bool:
        """Start reading the disk blocks among `hashes` into host memory (already started: nothing),
        and keep all of them there until `release`: a waiting request's prefix is not given up
        to make room for its own reads, nor for another request's. False, and nothing started,
        when host memory cannot hold them beside what other waiting requests fetched: the
        request asks again once some of those have been released."""

    def release(self, hashes: set[int]) -> None:
        """A request that fetched these blocks has been admitted or has ended: once no waiting
        request holds them they may be given up again."""

    def reading_any(self, hashes: set[int]) -> bool:
        """Whether a read of any of `hashes` is under way."""

    def poll(self, timeout: float = 0.0) -> None:
        """Take in what finished copying (with a timeout: wait that long for a disk read)."""

    @property
    def reading(self) -> int:
        """Disk reads under way."""

    def tier_blocks(self) -> dict[str, tuple[int, int]]:
        """(blocks, bytes) each lower tier holds now."""

    def tier_of(self, key: int) -> str | None:
        """The highest tier below the device that holds `key` (HOST or DISK), or None."""

    def watch(self, enabled: bool) -> None:
        """Record the keys that enter or leave a tier, for `take_changed`; when it starts, every
        key held counts as changed (a restarted engine's disk blocks are announced)."""

    def take_changed(self) -> set[int]:
        """The keys that entered or left a tier since the last call, while watching."""

    def close(self, device_blocks: list[tuple[int, int]] = ()) -> None:
        """Finish the copies under way and stop the disk tier's worker thread once it has written
        them. With a disk tier, the cached device blocks `device_blocks` ((hash, block)) that no
        tier holds yet are written down first: the engine restarted finds them on disk."""
