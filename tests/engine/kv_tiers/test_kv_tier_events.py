"""The engine's KV events name the tier that holds a block: device, host memory, disk, or none.
Followed step by step, they always agree with what the tiers hold; a block moves down and back
up; a restarted engine announces what its disk tier kept. Each request's usage says how many of
its cached tokens came from each tier, and closing the engine writes what its device cached to
disk and ends the disk tier's thread with every write done."""

import os
import random

import pytest

from common.prefix_hash import cache_seed, chain_block_hashes
from engine.base.config import EngineConfig
from engine.core.contract import DEVICE, DISK, HOST
from engine.core.sampling_params import SamplingParams
from engine.llm_engine import LLMEngine
from engine.offline import Completion, collect, make_request

BLOCK = 16
BLOCK_BYTES = 2 * 2 * 2 * BLOCK * 16 * 4  # tiny model: layers x (K, V) x kv heads x block x head dim x fp32
SAMPLING = SamplingParams(max_tokens=2, ignore_eos=True)


def make_engine(model, disk_path, host_blocks: int) -> LLMEngine:
    engine = LLMEngine(model, EngineConfig(
        chunk_size=64, max_chunk_per_gpu=4, max_num_batched_tokens=64, block_size=BLOCK, dtype="float32",
        kv_host_tier_gib=host_blocks * BLOCK_BYTES / (1 << 30), kv_disk_tier_path=str(disk_path)))
    engine.set_kv_events(True)
    return engine


def tier_now(engine: LLMEngine, h: int) -> str | None:
    """Where the block is, read from the tiers themselves."""
    tiers = engine.lower_tiers
    if engine.block_manager.holds(h):
        return DEVICE
    if h in tiers.host:
        return HOST
    return DISK if h in tiers.disk.index else None


def ask(engine: LLMEngine, prompt: list[int], announced: dict[int, str | None], history: list[dict]) -> Completion:
    """Run one request to its end, applying each step's events to `announced` (as a gateway
    would) and checking them against the tiers after every step."""
    request = make_request(engine, prompt, SAMPLING)
    completions = {request.request_id: Completion(request.request_id)}
    engine.add_request(request)
    while engine.has_unfinished():
        result = engine.step()
        collect(completions, result.outputs)
        history.append(dict(result.kv_events))
        announced.update(result.kv_events)
        held = {h for h in announced if tier_now(engine, h) is not None}
        assert {h: announced[h] for h in held} == {h: tier_now(engine, h) for h in held}
        assert not [h for h, tier in announced.items() if tier is not None and tier_now(engine, h) is None]
    return completions[request.request_id]


@pytest.fixture(scope="module")
def documents():
    rng = random.Random(3)
    return [[rng.randrange(100, 40000) for _ in range(150)] for _ in range(4)]  # 9 full blocks each


def test_events_follow_blocks_down_the_tiers_and_back(tiny_model, documents, tmp_path):
    engine = make_engine(tiny_model, tmp_path, host_blocks=24)  # host memory: two documents and a bit
    announced: dict[int, str | None] = {}
    history: list[dict] = []
    first = chain_block_hashes(documents[0], BLOCK, cache_seed())[:9]
    outputs = [ask(engine, doc + [7, 8], announced, history) for doc in documents]
    assert [announced[h] for h in first] != [DEVICE] * 9, "the device (256 tokens) no longer holds document 0"
    assert all(announced[h] in (HOST, DISK) for h in first)
    again = ask(engine, documents[0] + [9, 10], announced, history)
    assert [announced[h] for h in first] == [DEVICE] * 9
    assert [tier for step in history for h, tier in step.items() if h == first[0]][:2] == [DEVICE, HOST]
    # usage: cached tokens, by the tier they came from
    assert [o.last.usage.cached_tokens for o in outputs] == [0, 0, 0, 0]
    usage = again.last.usage
    assert usage.cached_tokens == 9 * BLOCK and usage.host_cached_tokens + usage.disk_cached_tokens == 9 * BLOCK
    engine.close()


def test_a_restarted_engine_announces_its_disk_and_reads_from_it(tiny_model, documents, tmp_path):
    engine = make_engine(tiny_model, tmp_path, host_blocks=1)  # the least: every document goes through disk
    for doc in documents:
        ask(engine, doc + [7, 8], {}, [])
    engine.close()
    disk = engine.lower_tiers.disk
    assert not disk._thread.is_alive(), "close ends the disk tier's worker thread"
    files = [name for name in os.listdir(disk.dir) if name.endswith(".kv")]
    assert len(files) == len(disk.index) > 0 and not [n for n in os.listdir(disk.dir) if n.endswith(".tmp")]

    restarted = make_engine(tiny_model, tmp_path, host_blocks=1)
    first_events = restarted.step().kv_events  # nothing to run: what the tiers held at start
    assert set(first_events) == set(restarted.lower_tiers.disk.index.keys()) and set(first_events.values()) == {DISK}
    announced = dict(first_events)
    # document 0 had left the device before the restart, document 3 was still there: close wrote it down
    for doc in (documents[0], documents[3]):
        usage = ask(restarted, doc + [9, 10], announced, []).last.usage
        assert usage.cached_tokens == usage.disk_cached_tokens == 9 * BLOCK and usage.host_cached_tokens == 0
    restarted.close()
