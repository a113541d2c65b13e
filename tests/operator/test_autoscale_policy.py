import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators.autoscale_policy import PoolObservation, Recommendation, ScalingRules, decide

RULES = ScalingRules(min_replicas=1, max_replicas=20)


def seen(replicas, qps, ready=None, now=1000.0, age=1.0):
    return PoolObservation(now=now, replicas=replicas, ready_replicas=replicas if ready is None else ready,
                           qps=qps, qps_age_s=age)


def covered(replicas, now=1000.0, window=300.0):
    """A history that has recommended `replicas` since before the scale-down window."""
    return (Recommendation(now - window - 10, replicas), Recommendation(now - 5, replicas))


@pytest.mark.parametrize(
    "replicas, qps, expected, reason",
    [
        (4, 4 * 81, 5, "ScaledUp"),  # passes 80 per replica: scale out
        (1, 81, 2, "ScaledUp"),
        (4, 4 * 80, 4, "Steady"),  # exactly at target: hold
        (10, 10 * 75, 10, "Steady"),  # ceil(9.4) is still 10
        (20, 20 * 75, 20, "WithinTolerance"),  # wants 19, but the load is within 10% below target
        (20, 20 * 72, 20, "WithinTolerance"),  # the edge of the band still holds
        (20, 20 * 70, 18, "ScaledDown"),  # below the band: down to ceil(1400 / 80)
        (2, 800, 4, "ScaleUpLimited"),  # wants 10, at most doubles per step
        (1, 0, 1, "AtMinReplicas"),  # no load: never below minReplicas
        (20, 5000, 20, "AtMaxReplicas"),
    ],
)
def test_table_with_ready_pods_and_a_covered_window(replicas, qps, expected, reason):
    decision = decide(RULES, seen(replicas, qps), covered(0))
    assert (decision.replicas, decision.reason) == (expected, reason)


def test_scale_down_waits_for_the_scale_down_window():
    history, replicas = covered(10, now=0.0), 10  # the last recommendation of 10 was at t=-5
    sizes = {}
    for now in range(0, 301, 5):  # the load falls to half at t=0 and stays there
        decision = decide(RULES, seen(replicas, 400, now=float(now)), history)
        history, replicas = decision.history, decision.replicas
        sizes[now] = (replicas, decision.reason)
    assert sizes[290] == (10, "ScaleDownStabilising")
    assert sizes[295] == (5, "ScaledDown")
    assert sizes[300] == (5, "Steady")


def test_scale_down_goes_to_the_highest_recommendation_of_the_window():
    history = (Recommendation(600.0, 10), Recommendation(800.0, 8), Recommendation(950.0, 7))
    assert decide(RULES, seen(10, 300), history).replicas == 8


def test_after_an_operator_restart_scale_down_waits_a_full_window():
    decision = decide(RULES, seen(10, 100, now=0.0))
    assert (decision.replicas, decision.reason) == (10, "ScaleDownStabilising")
    assert decide(RULES, seen(10, 100, now=301.0), decision.history).replicas == 2


def test_scale_up_window_needs_the_whole_window_to_agree():
    rules = ScalingRules(min_replicas=1, max_replicas=20, scale_up_window_s=60)
    first = decide(rules, seen(4, 800, now=0.0), covered(4, now=0.0))
    assert (first.replicas, first.reason) == (4, "ScaleUpStabilising")
    later = decide(rules, seen(4, 800, now=61.0), first.history)
    assert later.replicas == 8
    # a spike that does not last does not scale up
    spike = decide(rules, seen(4, 2000, now=0.0), covered(4, now=0.0))
    after = decide(rules, seen(4, 300, now=30.0), spike.history)
    assert after.replicas == 4


def test_scale_up_is_immediate_with_the_default_window():
    assert decide(RULES, seen(4, 480), ()).replicas == 6


def test_pods_still_starting_count_as_capacity():
    # 10 requested, 6 ready: 850 QPS is 85 per requested replica, within the cooldown band
    decision = decide(RULES, seen(10, 850, ready=6), covered(10))
    assert (decision.replicas, decision.reason) == (10, "PodsStarting")
    # with every pod ready the same load scales out at once
    assert decide(RULES, seen(10, 850), covered(10)).replicas == 11


def test_pods_still_starting_do_not_hold_back_a_load_beyond_the_band():
    decision = decide(RULES, seen(10, 1000, ready=6), covered(10))
    assert (decision.replicas, decision.reason) == (13, "ScaledUp")


def test_starting_pods_the_load_no_longer_needs_are_released():
    # the burst is over: 6 ready pods carry 400 QPS; the 4 still starting go now,
    # without waiting for the scale-down window
    decision = decide(RULES, seen(10, 400, ready=6), covered(10))
    assert (decision.replicas, decision.reason) == (6, "StartingPodsReleased")


def test_a_pool_woken_from_zero_keeps_its_first_pod_while_it_starts():
    """Its first requests wait for that pod, and their QPS has left the window: releasing it
    would leave the waiting requests with no engine (seen under k25 up on a busy machine)."""
    rules = ScalingRules(min_replicas=0, max_replicas=4)
    woken = decide(rules, seen(0, 3.0, ready=0), ())
    assert (woken.replicas, woken.reason) == (1, "ScaledUp")
    quiet = decide(rules, seen(1, 0.0, ready=0, now=1010.0), woken.history)
    assert (quiet.replicas, quiet.reason) == (1, "ScaleDownStabilising")


def test_starting_pods_are_kept_while_the_ready_ones_would_be_busy():
    decision = decide(RULES, seen(10, 470, ready=6), covered(10))  # 78 per ready pod
    assert (decision.replicas, decision.reason) == (10, "ScaleDownStabilising")


@pytest.mark.parametrize("qps, age, reason", [(None, None, "QpsMissing"), (None, 2.0, "QpsMissing"),
                                              (500.0, 31.0, "QpsStale"), (None, 120.0, "QpsStale")])
def test_missing_or_stale_data_holds_and_says_so(qps, age, reason):
    decision = decide(RULES, seen(4, qps, age=age), covered(4))
    assert (decision.replicas, decision.reason, decision.lacks_data) == (4, reason, True)
    assert "holding" in decision.message


def test_a_gap_in_the_data_restarts_the_scale_down_window():
    history = covered(10, now=0.0)
    for now in (0.0, 100.0, 200.0):
        history = decide(RULES, seen(10, None, age=None, now=now), history).history
    assert decide(RULES, seen(10, 100, now=250.0), history).replicas == 10
    assert decide(RULES, seen(10, 100, now=501.0), history).replicas == 2


def test_bounds_win_even_without_data():
    rules = ScalingRules(min_replicas=3, max_replicas=6)
    assert decide(rules, seen(10, None, age=None)).replicas == 6
    assert decide(rules, seen(1, None, age=None)).replicas == 3


def test_bounds_win_over_the_step_limit_and_the_windows():
    rules = ScalingRules(min_replicas=10, max_replicas=12)
    decision = decide(rules, seen(2, 0), ())
    assert (decision.replicas, decision.reason) == (10, "ClampedToBounds")
    assert decide(rules, seen(20, 5000), ()).replicas == 12


def test_never_to_zero_unless_min_replicas_is_zero():
    assert decide(RULES, seen(1, 0), covered(0)).replicas == 1
    rules = ScalingRules(min_replicas=0, max_replicas=4)
    assert decide(rules, seen(1, 0), covered(0)).replicas == 0


def test_from_zero_the_first_request_brings_one_replica():
    rules = ScalingRules(min_replicas=0, max_replicas=4)
    assert decide(rules, seen(0, 0), covered(0)).replicas == 0
    assert decide(rules, seen(0, 200), covered(0)).replicas == 1


def test_the_message_tells_the_numbers():
    message = decide(RULES, seen(10, 850, ready=6), covered(10)).message
    assert "850.0 QPS" in message and "6 ready, 4 starting" in message


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(min_replicas=-1, max_replicas=2), "minReplicas"),
        (dict(min_replicas=3, max_replicas=2), "minReplicas"),
        (dict(min_replicas=1, max_replicas=2, target_qps_per_replica=0), "targetQPSPerReplica"),
        (dict(min_replicas=1, max_replicas=2, tolerance=-0.1), "tolerance"),
        (dict(min_replicas=1, max_replicas=2, tolerance=1.0), "tolerance"),
        (dict(min_replicas=1, max_replicas=2, scale_down_window_s=-1), "windows"),
        (dict(min_replicas=1, max_replicas=2, max_step_factor=1.0), "max_step_factor"),
        (dict(min_replicas=1, max_replicas=2, stale_after_s=0), "stale_after_s"),
    ],
)
def test_bad_rules_are_refused(kwargs, error):
    with pytest.raises(ValueError, match=error):
        ScalingRules(**kwargs)


# -- properties ---------------------------------------------------------------------------

rules_strategy = st.builds(
    lambda lo, span, target, up, down: ScalingRules(min_replicas=lo, max_replicas=lo + span,
                                                    target_qps_per_replica=target,
                                                    scale_up_window_s=up, scale_down_window_s=down),
    st.integers(0, 5), st.integers(0, 30), st.floats(1, 200), st.sampled_from([0, 15, 60]),
    st.sampled_from([0, 30, 300]),
)


@settings(max_examples=200, deadline=None)
@given(rules=rules_strategy, start=st.integers(0, 60),
       steps=st.lists(st.tuples(st.one_of(st.none(), st.floats(0, 1e5)), st.integers(0, 60),
                               st.floats(0.5, 400)), max_size=40))
def test_never_leaves_min_max(rules, start, steps):
    history, replicas, now = (), start, 0.0
    for qps, ready, dt in steps:
        now += dt
        decision = decide(rules, PoolObservation(now, replicas, min(ready, replicas), qps,
                                                 None if qps is None else 1.0), history)
        assert rules.min_replicas <= decision.replicas <= rules.max_replicas
        history, replicas = decision.history, decision.replicas


@settings(max_examples=200, deadline=None)
@given(rules=rules_strategy, start=st.integers(0, 40), qps=st.floats(0, 3000),
       start_steps=st.integers(0, 60), period_s=st.sampled_from([1.0, 5.0, 15.0]))
def test_never_flaps_under_constant_load(rules, start, qps, start_steps, period_s):
    """Under a constant load, with pods that take `start_steps` periods to become ready,
    the replica count moves in one direction only, then stays."""
    history, replicas, ready_at, now = (), start, [0] * start, 0.0
    sizes = []
    for step in range(200):
        now = step * period_s
        ready = sum(1 for t in ready_at if t <= step)
        decision = decide(rules, PoolObservation(now, replicas, ready, qps, 1.0), history)
        history = decision.history
        if decision.replicas > replicas:
            ready_at += [step + start_steps] * (decision.replicas - replicas)
        else:
            ready_at = sorted(ready_at)[:decision.replicas]  # starting pods go first
        replicas = decision.replicas
        sizes.append(replicas)
    moves = [b - a for a, b in zip(sizes, sizes[1:]) if b != a]
    assert all(m > 0 for m in moves) or all(m < 0 for m in moves), sizes
    assert len(set(sizes[-20:])) == 1, sizes
