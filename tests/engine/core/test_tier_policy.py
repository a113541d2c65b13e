"""The KV tiers' policy: the eviction score weighs recency and frequency as configured, and a
bounded index never loses, duplicates or over-fills, and never gives up a pinned block."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.tier_key import tier_namespace
from engine.core.tier_policy import ScoreWeights, TierIndex, eviction_score


def test_score_is_recency_and_frequency_weighted():
    lru, lfu = ScoreWeights(1.0, 0.1), ScoreWeights(0.0, 0.1)
    # recency only: the older block scores lower, by exp(-decay * age)
    assert eviction_score(0.0, 1, 10.0, lru) == pytest.approx(math.exp(-1.0))
    assert eviction_score(5.0, 1, 10.0, lru) > eviction_score(0.0, 100, 10.0, lru)
    # frequency only: the block used more scores higher, whatever its age
    assert eviction_score(0.0, 9, 10.0, lfu) == pytest.approx(0.9)
    assert eviction_score(0.0, 9, 10.0, lfu) > eviction_score(10.0, 1, 10.0, lfu)
    with pytest.raises(ValueError):
        ScoreWeights(1.5, 0.1)
    with pytest.raises(ValueError):
        ScoreWeights(0.5, -1)


def test_the_lowest_score_goes_first_and_pinned_blocks_stay():
    index = TierIndex(2, ScoreWeights(1.0, 1.0))
    index.add(1, now=0.0)
    index.add(2, now=1.0)
    assert index.add(3, now=2.0)[1] == [1]  # the oldest went
    index.pin(2)
    assert index.add(4, now=3.0)[1] == [3]  # 2 is older but pinned
    index.pin(4)
    assert index.add(5, now=4.0) is None, "every slot pinned: nothing is given up"
    with pytest.raises(RuntimeError):
        index.remove(2)
    index.unpin(2)
    with pytest.raises(RuntimeError):
        index.unpin(2)
    assert TierIndex(0).add(1, now=0.0) is None


def test_namespace_changes_with_everything_that_changes_the_kv():
    base = dict(model_fingerprint="m", dtype="float32", quant=None, block_size=16, kv_shape=(2, 2, 4, 16, 8))
    variants = [dict(model_fingerprint="m2"), dict(dtype="bfloat16"), dict(quant="int8"), dict(block_size=32),
                dict(kv_shape=(2, 2, 4, 16, 16))]
    seen = {tier_namespace(**base)} | {tier_namespace(**{**base, **v}) for v in variants}
    assert len(seen) == 1 + len(variants)
    assert tier_namespace(**base) == tier_namespace(**base)


# an operation on the index: (kind, key, time step)
OPS = st.lists(st.tuples(st.sampled_from(["add", "touch", "pin", "unpin", "remove"]), st.integers(0, 12), st.integers(0, 5)),
               max_size=80)


@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(0, 5), ops=OPS, weight=st.floats(0, 1), decay=st.floats(0, 2))
def test_no_block_is_lost_duplicated_or_evicted_while_pinned(capacity, ops, weight, decay):
    index = TierIndex(capacity, ScoreWeights(weight, decay))
    held: set[int] = set()  # what the index should hold, by our own account
    pins: dict[int, int] = {}
    now = 0.0
    for kind, key, dt in ops:
        now += dt
        if kind == "add":
            result = index.add(key, now)
            if result is None:
                assert key not in held and (capacity == 0 or all(pins.get(k, 0) for k in held))
                continue
            _, evicted = result
            assert all(pins.get(k, 0) == 0 for k in evicted), "a pinned block was given up"
            assert set(evicted) <= held and key not in evicted
            held -= set(evicted)
            held.add(key)
        elif key not in held:
            continue
        elif kind == "touch":
            index.touch(key, now)
        elif kind == "pin":
            index.pin(key)
            pins[key] = pins.get(key, 0) + 1
        elif kind == "unpin" and pins.get(key, 0):
            index.unpin(key)
            pins[key] -= 1
        elif kind == "remove" and not pins.get(key, 0):
            index.remove(key)
            held.discard(key)
        assert set(index.keys()) == held, "a block was lost or appeared"
        slots = [index.get(k).slot for k in held]
        assert len(set(slots)) == len(slots) and all(0 <= s < capacity for s in slots), "two blocks share a slot"
        assert len(index) <= capacity
