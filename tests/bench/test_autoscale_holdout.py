import pytest

from bench.autoscale_holdout import seed_ranges, windows
from bench.simulation_summary import spread, with_ratios


def run(seconds, gpu_hours, hpa_seconds=100, released=0):
    figures = {"seconds_over_capacity": seconds, "requests_over_capacity": 0, "gpu_hours": gpu_hours,
               "scale_events": 4, "released_before_ready": released, "pods_created": released}
    hpa = {**figures, "seconds_over_capacity": hpa_seconds, "gpu_hours": 10.0, "released_before_ready": 0}
    return with_ratios({"predictive": figures, "hpa": hpa})


def test_seed_ranges_are_inclusive():
    assert seed_ranges("10-13,100-100,7") == [[10, 11, 12, 13], [100], [7]]


def test_every_three_consecutive_seeds_are_totalled_with_their_worst_seed():
    per_seed = {10: run(50, 10.0), 11: run(90, 10.4, released=3), 12: run(60, 9.8), 13: run(30, 10.0),
                100: run(10, 10.0)}
    found = windows(per_seed, [[10, 11, 12, 13], [100]], "predictive")
    assert [w["seeds"] for w in found] == ["10-12", "11-13"]  # 100 alone makes no window
    first = found[0]
    assert first["seconds_vs_hpa"] == round(200 / 300, 3)  # ratios to three places
    assert first["gpu_hours_vs_hpa"] == pytest.approx(30.2 / 30, abs=1e-3)
    assert (first["worst_seed"], first["worst_seconds_vs_hpa"], first["worst_gpu_hours_vs_hpa"]) == (11, 0.9, 1.04)
    assert first["released_before_ready"] == 3


def test_the_spread_names_the_median_and_the_worst_seed():
    found = spread({"10": run(50, 10.0), "11": run(90, 10.4), "12": run(60, 9.8)})["predictive"]
    assert found["seconds_over_capacity"] == {"median": 60, "worst": 90, "worst_seed": 11}
    assert found["gpu_hours_vs_hpa"] == {"median": 1.0, "worst": 1.04, "worst_seed": 11}
