"""The canary step as a pure function: a table of situations with the outcome the rules
(operators/rollout_policy.py's docstring, the CRD's descriptions) call for, and a property
test over random traffic."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.adapter_stats import LATENCY_BUCKETS, VersionStats
from operators.rollout_policy import RolloutStatus, decide_step, readiness, recovered_status
from operators.rollout_spec import parse_rollout_spec

SHA_A, SHA_B = "a" * 64, "b" * 64
SPEC_FIELDS = {"adapter": "legal", "pool": "h100", "stable": {"version": "v1", "source": "legal/v1", "sha256": SHA_A},
               "canary": {"version": "v2", "source": "legal/v2", "sha256": SHA_B}, "steps": [5, 20, 50, 100],
               "interval": 60, "maxErrorRate": 0.05, "maxP95LatencyMs": 1000, "minRequestsPerStep": 100,
               "failureThreshold": 3, "allowList": ["alice"]}
SPEC = parse_rollout_spec(SPEC_FIELDS)
NOW = 1_000_000.0


def stats(requests=150, errors=1, p95=0.5):
    return VersionStats(requests, errors, errors / requests if requests else None, p95 if requests else None)


def at(step, failures=0, opened=NOW - 60, phase="Progressing", weight=None, canary="v2"):
    return RolloutStatus(stable="v1", canary=canary, phase=phase, step=step,
                         weight=SPEC.steps[step] if weight is None else weight, failures=failures,
                         window_start=opened, reason="Advanced", message="")


HEALTHY, QUIET, ERRORS, SLOW = stats(), stats(requests=99, errors=0), stats(errors=15), stats(p95=2.5)

CASES = {
    # name: (status before, canary stats, canary loaded) -> (phase, step, weight, failures, reason, window opened)
    "start": ((None, HEALTHY, True), ("Progressing", 0, 5, 0, "Started", NOW)),
    "start, engines not ready yet": ((None, HEALTHY, False), ("Progressing", 0, 5, 0, "Started", NOW)),
    "interval not over": ((at(0, opened=NOW - 59.9), HEALTHY, True), ("Progressing", 0, 5, 0, "Advanced", NOW - 59.9)),
    "advance": ((at(0), HEALTHY, True), ("Progressing", 1, 20, 0, "Advanced", NOW)),
    "advance keeps earlier failures": ((at(1, failures=2), HEALTHY, True), ("Progressing", 2, 50, 2, "Advanced", NOW)),
    "hold: too little traffic": ((at(1), QUIET, True), ("Progressing", 1, 20, 0, "LowTraffic", NOW - 60)),
    "hold: too little traffic, even all errors": ((at(1), stats(requests=10, errors=10, p95=9), True),
                                                   ("Progressing", 1, 20, 0, "LowTraffic", NOW - 60)),
    "hold: engines not ready": ((at(1), HEALTHY, False), ("Progressing", 1, 20, 0, "EnginesNotReady", NOW)),
    "failed check: error rate": ((at(2), ERRORS, True), ("Progressing", 2, 50, 1, "CheckFailed", NOW)),
    "failed check: p95 latency": ((at(2), SLOW, True), ("Progressing", 2, 50, 1, "CheckFailed", NOW)),
    "failed check: latency above the last bucket": ((at(2), stats(p95=float("inf")), True),
                                                    ("Progressing", 2, 50, 1, "CheckFailed", NOW)),
    "failed check while engines not ready": ((at(2), ERRORS, False), ("Progressing", 2, 50, 1, "CheckFailed", NOW)),
    "limits are inclusive": ((at(2), stats(requests=100, errors=5, p95=1.0), True),
                             ("Progressing", 3, 100, 0, "Advanced", NOW)),
    "roll back at the threshold": ((at(2, failures=2), ERRORS, True), ("RolledBack", 2, 0, 3, "RolledBack", NOW - 60)),
    "promote at 100%": ((at(3), HEALTHY, True), ("Promoted", 3, 100, 0, "Promoted", NOW - 60)),
    "loaded nowhere: a failed check": ((at(1), QUIET, "nowhere"), ("Progressing", 1, 20, 1, "EnginesNotReady", NOW)),
    "loaded nowhere: roll back at the threshold": ((at(1, failures=2), QUIET, "nowhere"),
                                                    ("RolledBack", 1, 0, 3, "RolledBack", NOW - 60)),
    "no promotion while engines not ready": ((at(3), HEALTHY, False),
                                             ("Progressing", 3, 100, 0, "EnginesNotReady", NOW)),
    "rolled back stays": ((at(2, failures=3, phase="RolledBack", weight=0), HEALTHY, True),
                          ("RolledBack", 2, 0, 3, "Advanced", NOW - 60)),
    "promoted stays": ((at(3, phase="Promoted"), ERRORS, False), ("Promoted", 3, 100, 0, "Advanced", NOW - 60)),
    "a status for another canary starts over": ((at(2, canary="v0"), HEALTHY, True),
                                                ("Progressing", 0, 5, 0, "Started", NOW)),
    "a status off the steps starts over": ((at(1, weight=30), HEALTHY, True), ("Progressing", 0, 5, 0, "Started", NOW)),
}


@pytest.mark.parametrize("name", CASES)
def test_step_table(name):
    (before, canary, loaded), expected = CASES[name]
    nowhere = loaded == "nowhere"  # not loaded on any engine of the pool
    after = decide_step(SPEC, before, canary, loaded is True, NOW, loaded_nowhere=nowhere).status
    assert (after.phase, after.step, after.weight, after.failures, after.reason, after.window_start) == expected
    assert (after.stable, after.canary) == ("v1", "v2")


@pytest.mark.parametrize("name", ["start", "advance", "hold: too little traffic", "hold: engines not ready",
                                  "failed check: error rate", "no promotion while engines not ready"])
def test_a_running_rollout_writes_both_versions_with_the_weight_and_allow_list(name):
    (before, canary, loaded), (_, _, weight, *_) = CASES[name]
    state = decide_step(SPEC, before, canary, loaded, NOW).state
    assert (state.stable_version, state.stable_source, state.stable_sha256) == ("v1", "legal/v1", SHA_A)
    assert (state.canary_version, state.canary_source, state.canary_sha256) == ("v2", "legal/v2", SHA_B)
    assert (state.canary_weight, state.allow_list, state.phase) == (weight, ("alice",), "Progressing")


@pytest.mark.parametrize("name", ["roll back at the threshold", "rolled back stays"])
def test_a_rolled_back_rollout_leaves_only_the_stable_version(name):
    (before, canary, loaded), _ = CASES[name]
    state = decide_step(SPEC, before, canary, loaded, NOW).state
    assert (state.stable_version, state.stable_source, state.stable_sha256) == ("v1", "legal/v1", SHA_A)
    assert (state.canary_version, state.canary_source, state.canary_sha256, state.canary_weight) == ("", "", "", 0)
    assert (state.allow_list, state.phase) == ((), "RolledBack")


@pytest.mark.parametrize("name", ["promote at 100%", "promoted stays"])
def test_a_promoted_canary_becomes_the_only_stable_version(name):
    (before, canary, loaded), _ = CASES[name]
    state = decide_step(SPEC, before, canary, loaded, NOW).state
    assert (state.stable_version, state.stable_source, state.stable_sha256) == ("v2", "legal/v2", SHA_B)
    assert (state.canary_version, state.canary_weight, state.phase) == ("", 0, "Promoted")


def test_the_messages_say_why():
    def message(name):
        (before, canary, loaded), _ = CASES[name]
        return decide_step(SPEC, before, canary, loaded, NOW).status.message

    assert message("hold: too little traffic") == "holding at 20%: 99 canary requests in the last 60 s, 100 needed"
    assert message("failed check: error rate") == "holding at 50%: check failed (1 of 3): error rate 10.00% > 5.00%"
    assert message("failed check: p95 latency").endswith("p95 latency 2500 ms > 1000 ms")
    assert message("failed check: latency above the last bucket").endswith("p95 latency above 10000 ms > 1000 ms")
    assert message("roll back at the threshold") == ("rolled back to v1 after 3 failed checks; last: "
                                                     "error rate 10.00% > 5.00%")
    assert "h100" in message("hold: engines not ready") and "legal@v2" in message("hold: engines not ready")
    assert message("promote at 100%") == "v2 promoted to stable, v1 unloaded"


def test_a_check_records_the_figures_it_judged():
    after = decide_step(SPEC, at(2), ERRORS, True, NOW).status
    assert dataclasses.astuple(after.last_analysis) == (150, 0.1, 0.5, NOW)


def test_readiness_needs_every_live_engine_of_the_pool_to_report_the_version():
    engines = {"e1": {"pool": "h100", "adapters": ["legal@v2", "legal@v1"]},
               "e2": {"pool": "h100", "adapters": ["legal@v1"]},
               "e3": {"pool": "a100", "adapters": []},
               "e4": {"pool": "h100"}}
    found = readiness(engines, "h100", "legal", "v2")
    assert (found.engines, found.missing, found.ready) == (3, ("e2", "e4"), False)
    assert readiness({k: engines[k] for k in ("e1", "e3")}, "h100", "legal", "v2").ready is True
    assert readiness(engines, "h100", "legal", "v1").missing == ("e4",)
    empty = readiness({"e3": engines["e3"]}, "h100", "legal", "v2")
    assert (empty.engines, empty.ready) == (0, False)  # no engine at all is not ready


P95_VALUES = [bound for _, bound in LATENCY_BUCKETS]


@st.composite
def rollouts(draw):
    steps = sorted(draw(st.sets(st.integers(1, 99), max_size=5))) + [100]
    spec = parse_rollout_spec({**SPEC_FIELDS, "steps": steps, "interval": draw(st.integers(1, 120)),
                               "minRequestsPerStep": draw(st.integers(1, 500)),
                               "failureThreshold": draw(st.integers(1, 4)),
                               "maxErrorRate": draw(st.sampled_from([0.0, 0.01, 0.2])),
                               "maxP95LatencyMs": draw(st.sampled_from([50, 1000, 5000]))})
    ticks = draw(st.lists(st.tuples(
        st.floats(0.0, 2.5),  # time since the last tick, in intervals
        st.integers(0, 1000),  # canary requests
        st.floats(0.0, 1.0),  # share of them failed
        st.sampled_from(P95_VALUES), st.booleans()), min_size=1, max_size=40))
    return spec, ticks


@settings(max_examples=300, deadline=None)
@given(rollouts())
def test_weights_stay_on_the_steps_and_never_advance_without_a_passing_check(case):
    spec, ticks = case
    allowed = {0, *spec.steps}
    now, status = NOW, None
    for gap, requests, failed, p95, loaded in ticks:
        now += gap * spec.interval_s
        errors = round(requests * failed)
        canary = VersionStats(requests, errors, errors / requests if requests else None, p95 if requests else None)
        result = decide_step(spec, status, canary, loaded, now)
        after, state = result.status, result.state
        assert 0 <= after.weight <= 100 and after.weight in allowed and state.canary_weight in allowed
        assert after.failures <= spec.failure_threshold
        assert state.has_canary == (after.phase == "Progressing")
        if status is not None:
            if status.phase != "Progressing":
                assert after == status  # finished rollouts stay finished
            moved_on = after.weight > status.weight or (after.phase == "Promoted" and status.phase == "Progressing")
            if moved_on:
                assert now - status.window_start >= spec.interval_s
                assert requests >= spec.min_requests_per_step and loaded
                assert canary.error_rate <= spec.max_error_rate and p95 <= spec.max_p95_latency_s
                assert after.step == status.step + (after.phase != "Promoted")
            if after.phase == "RolledBack" and status.phase == "Progressing":
                assert after.failures == spec.failure_threshold and after.weight == 0
                assert state.stable_version == spec.stable.version
            if after.phase == "Promoted":
                assert after.weight == 100 and state.stable_version == spec.canary.version
        status = after


def test_a_lost_status_goes_on_from_the_state_this_spec_wrote():
    """A promoted rollout whose status was lost stays promoted (not back to 5% of users on the new
    version and 95% on the old), a canary keeps its step, and a state this spec did not write
    (another canary, a weight off the steps) starts over; so does a rollback, whose state (the
    stable version alone) would equally be that of a new rollout of another canary."""
    promoted = decide_step(SPEC, at(3), HEALTHY, True, NOW)
    assert recovered_status(SPEC, promoted.state, NOW).phase == "Promoted"
    assert decide_step(SPEC, recovered_status(SPEC, promoted.state, NOW), HEALTHY, True, NOW).state == promoted.state
    rolled_back = decide_step(SPEC, at(2, failures=2), ERRORS, True, NOW)
    assert recovered_status(SPEC, rolled_back.state, NOW) is None
    advanced = decide_step(SPEC, at(1), HEALTHY, True, NOW)  # to step 2, 50%
    resumed = recovered_status(SPEC, advanced.state, NOW)
    assert (resumed.phase, resumed.step, resumed.weight, resumed.reason) == ("Progressing", 2, 50, "Resumed")
    other = parse_rollout_spec({**SPEC_FIELDS, "canary": {"version": "v3", "source": "legal/v3", "sha256": SHA_A}})
    assert recovered_status(other, advanced.state, NOW) is None
    assert recovered_status(SPEC, dataclasses.replace(advanced.state, canary_weight=30), NOW) is None
    assert recovered_status(SPEC, None, NOW) is None


@pytest.mark.parametrize("canary, stable, failed", [
    (stats(p95=0.5), stats(p95=0.1), "p95 latency 500 ms > 3x stable's 100 ms"),
    (stats(p95=0.25), stats(p95=0.1), None),  # one bucket slower: within the bucket's own coarseness
    (stats(p95=0.25), stats(p95=0.25), None),  # as slow as stable: the version is not to blame
    (stats(p95=0.25), stats(requests=99, p95=0.1), None),  # too little stable traffic to compare with
    (stats(errors=9), stats(errors=6), None),  # 6% against stable's 4% + 5%
    (stats(errors=9), stats(errors=0), "error rate 6.00% > 5.00% (stable's 0.00% + 5.00%)"),
    (stats(p95=0.5), None, None),  # no stable figures: the absolute limits only (1000 ms here)
])
def test_a_check_compares_the_canary_with_the_stable_version_over_the_same_interval(canary, stable, failed):
    result = decide_step(SPEC, at(1), canary, True, NOW, stable=stable)
    if failed is None:
        assert result.status.reason == "Advanced"
    else:
        assert result.status.reason == "CheckFailed" and failed in result.status.message
