"""The KV tier benchmarks run end to end on the tiny model: what each side found cached is what
its design says (the figures they print are measured on SmolLM2, docs/benchmarks/index.md)."""

import pytest

from bench import kv_tier_copy_cost, kv_tiers_bench, kv_tiers_routing_bench

pytestmark = pytest.mark.slow
TINY = ["--model", "tiny-random", "--dtype", "float32"]


def test_copy_cost_brings_the_whole_document_back_from_each_tier():
    result = kv_tier_copy_cost.main([*TINY, "--doc-tokens", "256", "--repeats", "1"])
    assert result["none"]["cached_tokens"] == 0
    assert result["device"]["cached_tokens"] == result["host"]["cached_tokens"] == result["disk"]["cached_tokens"] == 256


def test_tier_aware_routing_finds_every_document_where_it_sent_it():
    results = kv_tiers_routing_bench.main([*TINY, "--documents", "6", "--doc-tokens", "240", "--rounds", "3",
                                           "--device-chunks", "2"])
    aware = results["tier-aware"]["tokens"]
    # each later question (2 rounds of 6) finds its document: all of its prompt but the question's block
    assert aware["device"] + aware["host"] == aware["prompt"] - 12 * 16 and aware["host"] > 0


def test_documents_come_back_from_each_tier_and_from_disk_after_a_restart():
    results = kv_tiers_bench.main([*TINY, "--documents", "4", "--doc-tokens", "240", "--rounds", "2", "--device-chunks", "2"])
    assert results["tiers off"]["cached_tokens"] == 0
    assert results["host tier"]["host_hit_tokens"] == results["host tier"]["cached_tokens"] == 4 * 240
    assert results["disk tier only (host = one prompt)"]["disk_hit_tokens"] > 0
    restart = results["after restart"]
    assert restart["found_at_start"] > 0 and restart["disk_share"] > 0.9 * 240 / 256
