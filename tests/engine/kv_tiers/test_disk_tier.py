"""The disk tier on a real directory: blocks round-trip, survive a new instance (a restart), stay
within their bound; a truncated, flipped or foreign file, a vanished directory and an unwritable
path each end as a dropped block or a start error, never as bytes served."""

import os
import shutil
import time

import pytest

from engine.core.tier_policy import ScoreWeights
from engine.kv_tiers.block_file import BlockFileError, read_block_file, write_block_file
from engine.kv_tiers.disk_tier import DiskTier, DiskTierError

NS, SIZE = 0xABC, 64


def payload(i: int) -> bytes:
    return bytes([i % 256]) * SIZE


def settle(tier: DiskTier) -> list:
    """Poll until the worker has answered every write and read queued; the reads' results."""
    reads = []
    while tier._pending_writes or tier.reading:
        reads += tier.poll(time.time(), timeout=0.2)
    return reads


def make(root, capacity=8) -> DiskTier:
    return DiskTier(str(root), NS, SIZE, capacity, ScoreWeights(1.0, 1.0), time.time())


def test_blocks_round_trip_survive_a_restart_and_stay_bounded(tmp_path):
    tier = make(tmp_path, capacity=2)
    for key in (1, 2, 3):
        tier.write(key, payload(key), time.time())
        settle(tier)
    tier.close()  # the worker has deleted what the bound gave up
    assert len(tier.index) == 2 and sorted(os.listdir(tier.dir)) == sorted(f"{k:016x}.kv" for k in tier.index.keys())
    again = make(tmp_path, capacity=2)
    assert again.stats.found_at_start == 2
    key = again.index.keys()[0]
    again.read(key)
    assert settle(again) == [(key, payload(key))]
    again.close()


def test_damaged_files_are_dropped_not_served(tmp_path):
    tier = make(tmp_path)
    for key in (1, 2, 3):
        tier.write(key, payload(key), time.time())
    settle(tier)
    with open(tier.path(1), "r+b") as f:  # flip a payload byte
        f.seek(-1, os.SEEK_END)
        f.write(b"\xff")
    with open(tier.path(2), "r+b") as f:
        f.truncate(20)
    os.replace(tier.path(3), tier.path(4))  # a file under another block's name
    tier.index.add(4, time.time())
    for key in (1, 2, 4):
        tier.read(key)
    assert sorted(settle(tier)) == [(1, None), (2, None), (4, None)]
    assert tier.stats.read_errors == 3 and 1 not in tier and 2 not in tier
    tier.close()
    assert not os.path.exists(tier.path(1)) and not os.path.exists(tier.path(2))


def test_block_file_refuses_another_namespace(tmp_path):
    path = str(tmp_path / "b.kv")
    write_block_file(path, NS, 5, payload(5))
    assert read_block_file(path, NS, 5, SIZE) == payload(5)
    with pytest.raises(BlockFileError, match="another block"):
        read_block_file(path, NS + 1, 5, SIZE)
    with pytest.raises(BlockFileError):
        read_block_file(str(tmp_path / "missing.kv"), NS, 5, SIZE)


def test_a_failing_write_is_logged_and_the_block_is_not_indexed(tmp_path, caplog):
    tier = make(tmp_path)
    shutil.rmtree(tier.dir)  # the volume went away under the engine
    tier.write(7, payload(7), time.time())
    settle(tier)
    assert 7 not in tier and tier.stats.write_errors == 1
    assert "not written" in caplog.text
    tier.close()


def test_an_unwritable_path_is_a_start_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(DiskTierError, match="not writable"):
        make(blocker / "tiers")
