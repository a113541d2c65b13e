"""An AdapterRollout's status to and from what Kubernetes stores."""

import pytest

from operators.rollout_policy import Analysis, Readiness, RolloutStatus
from operators.rollout_status import status_from_dict, status_to_dict

STATUS = RolloutStatus(stable="v1", canary="v2", phase="Progressing", step=1, weight=20, failures=1,
                       window_start=1_700_000_000.125, reason="CheckFailed", message="holding at 20%",
                       last_analysis=Analysis(requests=150, error_rate=0.1, p95_latency_s=0.25, at=1_700_000_000.125))
READY = Readiness(engines=2, missing=())


def test_a_status_survives_the_round_trip_through_kubernetes():
    stored = status_to_dict(STATUS, "h100", "legal@v2", READY, [], now=1_700_000_001.0)
    assert stored["windowStart"] == "2023-11-14T22:13:20.125+00:00"
    assert stored["lastAnalysis"] == {"requests": 150, "errorRate": 0.1, "p95LatencyMs": 250.0,
                                      "at": "2023-11-14T22:13:20.125+00:00"}
    assert status_from_dict(stored) == STATUS


def test_figures_that_json_cannot_hold_are_sent_as_null_so_the_merge_patch_clears_them():
    no_traffic = Analysis(requests=0, error_rate=None, p95_latency_s=None, at=1_700_000_000.0)
    too_slow = Analysis(requests=40, error_rate=0.0, p95_latency_s=float("inf"), at=1_700_000_000.0)
    for analysis in (no_traffic, too_slow):
        stored = status_to_dict(RolloutStatus(**{**STATUS.__dict__, "last_analysis": analysis}), "h100",
                                "legal@v2", READY, [], now=1_700_000_001.0)
        assert stored["lastAnalysis"]["p95LatencyMs"] is None
    fresh = status_to_dict(RolloutStatus(**{**STATUS.__dict__, "last_analysis": None}), "h100", "legal@v2", READY,
                           [], now=1_700_000_001.0)
    assert fresh["lastAnalysis"] is None


@pytest.mark.parametrize("readiness, expected", [
    (Readiness(2, ()), ("True", "AllEnginesLoaded", "every engine of pool h100 reports legal@v2 loaded")),
    (Readiness(3, ("e2", "e3")), ("False", "EnginesNotReady", "legal@v2 not loaded on e2, e3")),
    (Readiness(0, ()), ("False", "NoEngines", "no live engine in pool h100")),
])
def test_the_canary_loaded_condition_names_the_engines_that_lack_it(readiness, expected):
    conditions = status_to_dict(STATUS, "h100", "legal@v2", readiness, [], now=1_700_000_001.0)["conditions"]
    loaded = next(c for c in conditions if c["type"] == "CanaryLoaded")
    assert (loaded["status"], loaded["reason"], loaded["message"]) == expected


@pytest.mark.parametrize("stored", [
    {},
    {"phase": "Invalid", "message": "spec.steps must end at 100"},
    {"phase": "Progressing", "weight": 20},
    {"phase": "Progressing", "stable": "v1", "canary": "v2", "step": 1, "weight": 20, "failures": 0,
     "windowStart": "yesterday"},
])
def test_a_status_that_is_not_a_running_rollouts_reads_as_none(stored):
    assert status_from_dict(stored) is None
