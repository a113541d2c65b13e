"""The max_chunk_per_gpu decision (engine/hardware/chunk_choice.py): the rule over a curve, as `k25 bench
profile` applies it to a measured one and `--max-chunk-per-gpu auto` to a modelled one."""

import random

import pytest

from engine.base.errors import EngineConfigError
from engine.hardware.chunk_choice import CurvePoint, auto_max_chunk_per_gpu, modelled_curve, recommend


def curve(*rows):
    return [CurvePoint(v, tps, p95) for v, tps, p95 in rows]


@pytest.mark.parametrize("rows, largest, expected", [
    # throughput rises then flattens: the knee, not the top
    (((1, 100, 9.0), (2, 180, 5.0), (4, 300, 3.0), (6, 310, 2.9), (8, 312, 2.9)), 8, 4),
    # 6 within 5% of 8's throughput but its p95 is 30% worse: 8
    (((2, 100, 4.0), (6, 300, 3.9), (8, 310, 3.0)), 8, 8),
    # too many chunks is slower (memory pressure): the peak in the middle
    (((2, 100, 4.0), (6, 300, 2.0), (8, 200, 3.0)), 8, 6),
    # what does not fit is never recommended, even when it measured best
    (((2, 100, 4.0), (4, 150, 3.0), (8, 400, 1.0)), 4, 4),
    # a candidate that could not run (no throughput) is never recommended
    (((1, 0.0, 0.0), (2, 100, 4.0)), 8, 2),
])
def test_the_smallest_value_within_both_tolerances_of_the_best(rows, largest, expected):
    assert recommend(curve(*rows), largest).value == expected


def test_when_no_value_holds_both_the_smallest_within_the_throughput_tolerance_wins_and_says_so():
    # 8 is fastest, 2 has the best p95; 6 is within 5% of 8's throughput, its p95 is 50% above 2's
    choice = recommend(curve((2, 100, 2.0), (6, 300, 3.0), (8, 310, 3.1)), 8)
    assert choice.value == 6
    assert "none holds both" in choice.reason and "50% above the best" in choice.reason


def test_the_reason_states_the_rule_and_the_figures():
    choice = recommend(curve((1, 100, 9.0), (4, 300, 3.0)), 4, throughput_tolerance=0.1, latency_tolerance=0.2)
    assert choice.reason.startswith("the smallest value with throughput within 10% of the best (300) and p95 within "
                                    "20% of the best (3)")


def test_wider_tolerances_pick_a_smaller_value():
    points = curve((1, 100, 9.0), (2, 180, 5.0), (4, 300, 3.0), (8, 312, 2.9))
    assert recommend(points, 8, 0.05, 0.10).value == 4
    assert recommend(points, 8, 0.5, 2.0).value == 2
    assert recommend(points, 8, 0.0, 0.0).value == 8


@pytest.mark.parametrize("points, largest", [([], 8), (curve((16, 100, 1.0)), 8), (curve((2, 0.0, 1.0)), 8)])
def test_nothing_to_recommend_is_an_error(points, largest):
    with pytest.raises(ValueError, match="fits"):
        recommend(points, largest)


def random_curves(count=300):
    rng = random.Random(0)
    for _ in range(count):
        values = sorted(rng.sample(range(1, 65), rng.randint(1, 8)))
        yield [CurvePoint(v, rng.uniform(1, 500), rng.uniform(0.1, 10)) for v in values], rng.randint(values[0], 70)


def test_property_never_more_than_fits_and_always_a_measured_value():
    for points, largest in random_curves():
        value = recommend(points, largest).value
        assert value <= largest and value in {p.max_chunk_per_gpu for p in points}


def test_property_the_choice_is_within_the_throughput_tolerance_of_the_best_that_fits():
    for points, largest in random_curves():
        fitting = [p for p in points if p.max_chunk_per_gpu <= largest]
        chosen = next(p for p in fitting if p.max_chunk_per_gpu == recommend(points, largest).value)
        assert chosen.throughput >= 0.95 * max(p.throughput for p in fitting)


def test_property_a_flat_curve_picks_the_smallest():
    for points, largest in random_curves():
        flat = [CurvePoint(p.max_chunk_per_gpu, 200.0, 1.5) for p in points]
        assert recommend(flat, largest).value == min(p.max_chunk_per_gpu for p in flat)


# --- auto: the modelled curve ------------------------------------------------------------------


@pytest.mark.parametrize("largest, expected_chunks, max_num_seqs, expected", [
    (1000, 6, 64, 384),  # 64 requests of 6 chunks at once
    (100, 6, 64, 96),  # only 16 fit: the largest multiple of 6 that fits
    (8, 6, 64, 6),  # one request: 6, not 8 (2 idle chunks)
    (5000, 1, 64, 64),
    (10, 1, 4, 4),
])
def test_auto_runs_max_num_seqs_expected_requests_at_once_or_as_many_as_fit(largest, expected_chunks, max_num_seqs,
                                                                           expected):
    choice = auto_max_chunk_per_gpu(largest, expected_chunks, max_num_seqs)
    assert choice.value == expected and choice.value <= largest and choice.value % expected_chunks == 0
    assert f"requests of {expected_chunks} chunks at once" in choice.reason


def test_the_modelled_curve_stops_where_every_sequence_runs():
    points = modelled_curve(1000, 6, 4)
    assert [p.max_chunk_per_gpu for p in points] == [6, 12, 18, 24]
    assert [p.throughput for p in points] == [1, 2, 3, 4] and [p.p95_latency for p in points] == [4, 2, 2, 1]


def test_auto_refuses_when_not_one_expected_request_fits():
    with pytest.raises(EngineConfigError, match="not one request of 6 chunks fits; the largest max_chunk_per_gpu that fits is 5"):
        auto_max_chunk_per_gpu(5, 6, 64)
    with pytest.raises(EngineConfigError, match="at least 1"):
        auto_max_chunk_per_gpu(5, 0, 64)


# --- auto in the engine: what fits, read off the engine's own memory budget ----------------------


def test_an_engine_started_with_auto_runs_the_value_the_rule_gives(tiny_model, caplog):
    from engine.base.config import EngineConfig
    from engine.llm_engine import LLMEngine

    caplog.set_level("INFO", logger="engine.runner.memory_budget")
    engine = LLMEngine(tiny_model, EngineConfig(chunk_size=64, max_chunk_per_gpu="auto", expected_chunks_per_request=3,
                                                max_num_seqs=8))
    assert engine.max_chunk_per_gpu == 24 and engine.capacity_tokens == 24 * 64
    assert "max_chunk_per_gpu 24 (auto: 8 requests of 3 chunks at once" in caplog.text
    # a budget that holds only a few chunks: the largest multiple of 3 that fits
    with pytest.raises(EngineConfigError) as info:
        LLMEngine(tiny_model, EngineConfig(chunk_size=64, max_chunk_per_gpu=10**9, cpu_memory_budget_gib=0.1, max_num_seqs=64))
    largest = int(str(info.value).rsplit(" ", 1)[1])
    assert 3 <= largest < 64 * 3  # not 64 sequences of 3 chunks
    small = LLMEngine(tiny_model, EngineConfig(chunk_size=64, max_chunk_per_gpu="auto", expected_chunks_per_request=3,
                                               cpu_memory_budget_gib=0.1, max_num_seqs=64))
    assert small.max_chunk_per_gpu == largest // 3 * 3
