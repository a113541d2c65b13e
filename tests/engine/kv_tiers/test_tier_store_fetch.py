"""Disk reads for waiting requests land in host memory and stay there until those requests go:
the blocks they fetched never outnumber the host pool, so no read a request waits for is turned
away for want of room (a request that would not fit is refused and asks again later), and a
block two waiting requests share stays until both have gone."""

import time

import pytest
import torch

from engine.attention.kv_cache import KVCache
from engine.core.lower_tiers import DISK, HOST
from engine.core.tier_policy import ScoreWeights
from engine.kv_tiers.block_copy import block_shape
from engine.kv_tiers.disk_tier import DiskTier
from engine.kv_tiers.store import TierStore

BLOCK, HOST_BLOCKS, DISK_KEYS = 4, 4, list(range(1, 9))


@pytest.fixture
def store(tiny_model, tmp_path):
    kv = KVCache(tiny_model.config, 8 * BLOCK, "cpu", torch.float32)
    shape = block_shape(kv, BLOCK)
    block_bytes = 4 * int(torch.Size(shape).numel())
    disk = DiskTier(str(tmp_path), 1, block_bytes, 64, ScoreWeights(), time.time())
    for key in DISK_KEYS:
        disk.write(key, torch.full(shape, float(key)).view(torch.uint8).numpy().tobytes(), time.time())
    while disk._pending_writes:
        disk.poll(time.time(), timeout=0.2)
    store = TierStore(kv, BLOCK, HOST_BLOCKS, ScoreWeights(), disk)
    yield store
    store.close()


def settle(store: TierStore) -> None:
    while store.reading:
        store.poll(timeout=0.2)


def test_fetches_beyond_the_host_pool_are_refused_until_room_is_released(store):
    assert store.fetch([1, 2, 3])
    assert not store.fetch([4, 5]), "five blocks held for waiting requests in a pool of four"
    assert store.fetch([1, 2]), "blocks another waiting request holds take no more room"
    settle(store)
    assert store.find([1, 2, 3]) == [HOST] * 3
    store.release({1, 2, 3})
    assert not store.fetch([4, 5, 6]), "1 and 2 are still held for the second request"
    assert store.find([1, 2]) == [HOST] * 2
    store.release({1, 2})
    assert store.fetch([4, 5, 6, 7])
    settle(store)
    assert store.find([4, 5, 6, 7]) == [HOST] * 4 and store.find([8]) == [DISK]
    assert [float(store.pool[store.host.get(k).slot].flatten()[0]) for k in (4, 5, 6, 7)] == [4.0, 5.0, 6.0, 7.0]


def test_a_read_for_a_request_that_went_is_not_held(store):
    assert store.fetch([1, 2, 3, 4])
    store.release({1, 2, 3, 4})  # the request ended while its blocks were being read
    settle(store)
    assert store.fetch([5, 6, 7, 8]), "nothing is held any more"
    settle(store)
    assert store.find([5, 6, 7, 8]) == [HOST] * 4
