"""KV tiers: greedy outputs are the same token for token (fp32) with the tiers on and off, when
prefix blocks come back from host memory and from disk, across preemptions, mixed adapters and
an engine restart; a corrupted block file is recomputed, never served, and a disk tier that
fails mid-run costs hits, not answers; cached_tokens counts every tier."""

import os
import random

import pytest

from common.prefix_hash import cache_seed, chain_block_hashes
from engine.base.config import EngineConfig
from engine.core.sampling_params import SamplingParams
from engine.kv_tiers.block_file import block_file_name
from engine.llm_engine import LLMEngine
from engine.lora.adapter import AdapterRef
from engine.model.loader import load_model
from tests.helpers.lora_helpers import MIXED_SPECS, run_mixed, save_tiny_llama_with_adapters

GREEDY = SamplingParams(max_tokens=6, ignore_eos=True)
LONG = SamplingParams(max_tokens=40, ignore_eos=True)  # decodes that outgrow the device: preemptions
BLOCK = 16
BLOCK_BYTES = 2 * 2 * 2 * BLOCK * 16 * 4  # tiny model: layers x (K, V) x kv heads x block x head dim x fp32
DEVICE_CHUNKS = 6  # 384 tokens: two documents and a bit


@pytest.fixture(scope="module")
def tiny_with_adapters(tmp_path_factory, tiny_model):
    folder, root = tmp_path_factory.mktemp("tiny-llama"), tmp_path_factory.mktemp("adapters")
    save_tiny_llama_with_adapters(folder, root, tiny_model.tokenizer)
    return load_model(str(folder)), root


@pytest.fixture(scope="module")
def documents():
    """Four documents of 150 tokens (9 full blocks each), more than the device holds, and questions."""
    rng = random.Random(7)
    docs = [[rng.randrange(100, 40000) for _ in range(150)] for _ in range(4)]
    questions = [[rng.randrange(100, 40000) for _ in range(10)] for _ in range(2)]
    return docs, questions


def make_engine(model, root, **tiers) -> LLMEngine:
    settings = dict(kv_host_tier_gib=0.0)
    settings.update(tiers)
    engine = LLMEngine(model, EngineConfig(
        chunk_size=64, max_chunk_per_gpu=DEVICE_CHUNKS, max_num_batched_tokens=64, block_size=BLOCK, max_loras=2,
        max_cpu_loras=3, max_lora_rank=16, adapter_root=str(root), dtype="float32", **settings,
    ))
    for name in MIXED_SPECS:
        engine.load_adapter(name, "v1", name)
    return engine


def passes(documents):
    """A batch of first questions (all documents at once: preemptions), then second questions
    one document at a time, under the base model and two adapters (each document keeps its own)."""
    docs, questions = documents
    adapters = [None, "legal", "code"]
    batch = [(doc + questions[0], adapters[i % 3]) for i, doc in enumerate(docs)]
    singles = [[(doc + questions[1], adapters[i % 3])] for i, doc in enumerate(docs)]
    return [(batch, LONG)] + [(jobs, GREEDY) for jobs in singles]


def run(engine, documents):
    return [out for jobs, sampling in passes(documents) for out in run_mixed(engine, jobs, sampling)]


def host_gib(blocks: int) -> float:
    return blocks * BLOCK_BYTES / (1 << 30)


@pytest.fixture(scope="module")
def reference(tiny_with_adapters, documents):
    model, root = tiny_with_adapters
    return [o.token_ids for o in run(make_engine(model, root, prefix_caching=False), documents)]


def check_same(outputs, reference):
    assert all(o.finish_reason.value == "length" for o in outputs), [o.last.error for o in outputs]
    assert [o.token_ids for o in outputs] == reference


@pytest.mark.slow
def test_host_tier_brings_documents_back(tiny_with_adapters, documents, reference):
    model, root = tiny_with_adapters
    device_only = make_engine(model, root)
    baseline = run(device_only, documents)
    engine = make_engine(model, root, kv_host_tier_gib=host_gib(200))
    outputs = run(engine, documents)
    check_same(outputs, reference)
    check_same(baseline, reference)
    stats = engine.lower_tiers.stats
    assert engine.num_preemptions > 0 and stats.offloaded_blocks > 0 and stats.restored_blocks > 0
    assert stats.host_hit_tokens > 0 and stats.disk_hit_tokens == 0
    # cached_tokens counts the tiers: more than the device alone found
    assert sum(o.last.usage.cached_tokens for o in outputs) > sum(o.last.usage.cached_tokens for o in baseline)
    assert sum(o.last.usage.cached_tokens for o in outputs) >= stats.host_hit_tokens


@pytest.mark.slow
def test_disk_tier_across_restart_and_a_corrupted_block(tiny_with_adapters, documents, reference, tmp_path):
    model, root = tiny_with_adapters
    # a host tier of 24 blocks (the least beside a disk tier: one longest prompt) in front of the disk
    engine = make_engine(model, root, kv_host_tier_gib=host_gib(1), kv_disk_tier_path=str(tmp_path))
    check_same(run(engine, documents), reference)
    stats = engine.lower_tiers.stats
    assert stats.disk_hit_tokens > 0, "some prefix blocks were read back from disk"
    engine.lower_tiers.close()  # the writes under way finish
    disk = engine.lower_tiers.disk
    files = sorted(os.listdir(disk.dir))
    assert len(files) == len(disk.index) > 0
    # the same pod, a new engine: flip a byte in the first block of document 0, truncate document 1's;
    # after the restart each is the first block its document looks up
    docs, _ = documents
    damaged = [block_file_name(chain_block_hashes(docs[0][:BLOCK], BLOCK, cache_seed())[0]),
               block_file_name(chain_block_hashes(docs[1][:BLOCK], BLOCK, cache_seed(AdapterRef("legal", "v1").key))[0])]
    assert set(damaged) <= set(files)
    with open(os.path.join(disk.dir, damaged[0]), "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    with open(os.path.join(disk.dir, damaged[1]), "r+b") as f:
        f.truncate(50)
    restarted = make_engine(model, root, kv_host_tier_gib=host_gib(1), kv_disk_tier_path=str(tmp_path))
    assert restarted.lower_tiers.disk.stats.found_at_start == len(files)
    outputs = run(restarted, documents)
    check_same(outputs, reference)
    after = restarted.lower_tiers
    assert after.stats.disk_hit_tokens > 0
    # the first batch after the restart found the intact documents on disk
    assert [o.last.usage.cached_tokens > 0 for o in outputs[:4]] == [False, False, True, True]
    assert after.disk.stats.read_errors == 2, "both damaged files were read, refused and dropped"
    after.close()


@pytest.mark.slow
def test_a_disk_tier_that_fails_under_load_costs_hits_never_answers(tiny_with_adapters, documents, reference, tmp_path):
    """The volume goes away mid-run (as a full or unmounted disk would fail every write and read):
    the blocks the tier had are recomputed, the new ones are not written, every answer is the same."""
    import shutil

    model, root = tiny_with_adapters
    engine = make_engine(model, root, kv_host_tier_gib=host_gib(1), kv_disk_tier_path=str(tmp_path / "tier"))
    check_same(run(engine, documents), reference)
    disk = engine.lower_tiers.disk
    assert len(disk.index) > 0
    shutil.rmtree(disk.dir)
    check_same(run(engine, documents), reference)
    assert disk.stats.read_errors + disk.stats.write_errors > 0, "the failures were met, and survived"
    engine.lower_tiers.close()


def test_a_disk_path_that_cannot_be_written_refuses_to_start(tiny_model, tmp_path):
    from engine.base.errors import EngineConfigError

    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(EngineConfigError, match="kv-disk-tier-path"):
        LLMEngine(tiny_model, EngineConfig(chunk_size=64, max_chunk_per_gpu=2, dtype="float32",
                                           kv_disk_tier_path=str(blocker / "tiers")))
