import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators.autoscale_policy import PoolObservation, Recommendation, ScalingRules, decide
from operators.predictive_policy import (Forecast, PoolSignals, PredictiveRules, decide_predictive, forecast,
                                         startup_estimate)

RULES = ScalingRules(min_replicas=1, max_replicas=20)
PREDICTIVE = PredictiveRules()
SEEN = (60.0, 120.0, 180.0, 240.0)  # start-ups the pool has seen


def seen(replicas, qps, ready=None, now=1000.0, age=1.0):
    return PoolObservation(now=now, replicas=replicas, ready_replicas=replicas if ready is None else ready,
                           qps=qps, qps_age_s=age)


def covered(replicas, now=1000.0, window=300.0):
    """A history that has recommended `replicas` since before the scale-down window."""
    return (Recommendation(now - window - 10, replicas), Recommendation(now - 5, replicas))


def ramp(start, per_second, seconds=240):
    return tuple(start + per_second * t for t in range(seconds))


def test_a_steady_ramp_is_extrapolated_to_the_horizon():
    expected = forecast(PREDICTIVE, ramp(100.0, 1.0), level=339.0, horizon_s=120.0)
    assert expected.trend == pytest.approx(1.0)
    assert expected.qps == pytest.approx(339.0 + 120.0)


def test_a_flat_series_a_step_and_a_short_series_give_no_trend():
    flat = forecast(PREDICTIVE, (500.0, 520.0) * 120, level=510.0, horizon_s=180.0)
    step = forecast(PREDICTIVE, (300.0,) * 200 + (900.0,) * 40, level=900.0, horizon_s=180.0)
    short = forecast(PREDICTIVE, ramp(100.0, 1.0, seconds=30), level=130.0, horizon_s=180.0)
    assert (flat.qps, flat.horizon_s, flat.trend) == (510.0, 180.0, 0.0)
    assert (step.qps, step.horizon_s, step.trend) == (900.0, 180.0, 0.0)  # one half is flat: a step is not a trend
    assert (short.qps, short.horizon_s, short.trend) == (130.0, 180.0, 0.0)


def test_seconds_without_data_are_left_out_of_the_fit():
    gappy = tuple(None if t % 3 == 0 else 100.0 + 2.0 * t for t in range(240))
    assert forecast(PREDICTIVE, gappy, level=580.0, horizon_s=10.0).trend == pytest.approx(2.0)


def test_a_falling_forecast_is_never_below_zero():
    assert forecast(PREDICTIVE, ramp(500.0, -2.0), level=20.0, horizon_s=300.0).qps == 0.0


def test_the_horizon_is_the_median_start_up_of_the_pools_pods_or_the_default():
    assert startup_estimate(PREDICTIVE, (60.0, 240.0, 100.0)) == 100.0
    assert startup_estimate(PREDICTIVE, ()) == PREDICTIVE.default_startup_s


@pytest.mark.parametrize(
    "replicas, qps, signals, expected, reason",
    [
        # 6 pods at 479 QPS (80 per pod) rising 1 QPS/s, pods start in 120 s: plans for 599
        (6, 479.0, PoolSignals(ramp(240.0, 1.0), (120.0,) * 3), 8, "ScaledUpForForecast"),
        # the same load without a trend: the pods serve it
        (6, 479.0, PoolSignals((479.0,) * 240, (120.0,) * 3), 6, "Steady"),
        # above target but within the 10% band: no scale-out yet
        (6, 520.0, PoolSignals((520.0,) * 240), 6, "Steady"),
        (6, 530.0, PoolSignals((530.0,) * 240), 7, "ScaledUp"),
        # requests queue: the plan wants 7 of which 6 are ready; four pods start for the one missing
        # (one in four is ready within 60 s: (60 + 3) x 60 pod-seconds beat 60 x 240)
        (6, 530.0, PoolSignals((530.0,) * 240, SEEN, waiting=100), 10, "QueueGuard"),
        # without a start-up seen, nothing says that more pods would be ready sooner
        (6, 530.0, PoolSignals((530.0,) * 240, waiting=100), 7, "ScaledUp"),
        # requests queue although every planned pod is ready: one more pod
        (6, 470.0, PoolSignals((470.0,) * 240, waiting=100), 7, "ScaledUpForQueue"),
        # a queue within the guard's threshold changes nothing
        (6, 479.0, PoolSignals((479.0,) * 240, waiting=40), 6, "Steady"),
        # pods that wait for a node: the pool does not grow
        (6, 479.0, PoolSignals(ramp(240.0, 1.0), (120.0,) * 3, unschedulable=1), 6, "NodesFull"),
        # the load fell below the band and the window is covered: down
        (10, 300.0, PoolSignals((300.0,) * 240), 4, "ScaledDown"),
        # a steady load is sized up to the scale-out threshold: 650 / 88 QPS, not 650 / 80...
        (10, 650.0, PoolSignals((650.0,) * 240), 8, "ScaledDown"),
        # ...a wandering one keeps four standard deviations of room below it (650 + 4 x 50 over 88)
        (10, 650.0, PoolSignals(tuple(650.0 + (50.0 if t // 10 % 2 else -50.0) for t in range(240))), 9,
         "ScaledDown"),
        (20, 5000.0, PoolSignals((5000.0,) * 240, waiting=10_000), 20, "AtMaxReplicas"),
    ],
)
def test_table(replicas, qps, signals, expected, reason):
    decision = decide_predictive(RULES, PREDICTIVE, seen(replicas, qps), signals, covered(0))
    assert (decision.replicas, decision.reason) == (expected, reason)


def test_a_queue_with_every_planned_pod_ready_adds_one_pod_at_a_time():
    queueing = PoolSignals((470.0,) * 240, waiting=100)
    starting = decide_predictive(RULES, PREDICTIVE, seen(7, 470.0, ready=6), queueing, covered(0))
    assert (starting.replicas, starting.reason) == (7, "Steady")  # the pod on its way is kept, no other
    ready = decide_predictive(RULES, PREDICTIVE, seen(7, 470.0), queueing, covered(0))
    assert (ready.replicas, ready.reason) == (8, "ScaledUpForQueue")


def test_the_hedge_stays_within_the_step_limit_and_max():
    queueing = PoolSignals((800.0,) * 240, SEEN, waiting=1000)
    # the plan wants 10 and 4 are ready: worth starting many, but one step at most doubles...
    assert decide_predictive(RULES, PREDICTIVE, seen(6, 800.0, ready=4), queueing, covered(0)).replicas == 12
    # ...and never beyond max
    small = ScalingRules(min_replicas=1, max_replicas=10)
    assert decide_predictive(small, PREDICTIVE, seen(6, 800.0, ready=4), queueing, covered(0)).replicas == 10


def test_the_hedge_counts_pods_already_starting_by_their_age():
    queueing = PoolSignals((530.0,) * 240, SEEN * 2, waiting=100)  # 8 start-ups seen: ages count
    young = decide_predictive(RULES, PREDICTIVE, seen(7, 530.0, ready=6), dataclasses.replace(
        queueing, starting_age_s=(0.0,)), covered(0))
    nearly = decide_predictive(RULES, PREDICTIVE, seen(7, 530.0, ready=6), dataclasses.replace(
        queueing, starting_age_s=(235.0,)), covered(0))
    assert young.replicas == 10 and young.reason == "QueueGuard"  # as if none were starting
    assert nearly.replicas == 7  # the missing pod is due within 5 s: nothing is worth starting


def test_a_higher_price_of_being_over_capacity_starts_more_pods():
    queueing = PoolSignals((800.0,) * 240, SEEN, waiting=1000)
    counts = [decide_predictive(RULES, PredictiveRules(over_capacity_pod_s=price), seen(8, 800.0, ready=6), queueing,
                                covered(0)).replicas for price in (0.0, 20.0, 60.0, 200.0)]
    assert counts == sorted(counts) and counts[0] == 10 and counts[-1] > counts[0]


def test_a_starting_pod_is_kept_while_its_expected_use_is_worth_its_cost():
    """10 ready and 2 starting for a load that 10 serve: a pod nearly ready that the load may
    still need is kept, one 40 s from ready is not worth it; pods just created for a load that
    will not need them are released."""
    wobbly = tuple(760.0 + (100.0 if t // 10 % 2 else -100.0) for t in range(240))  # 10 s blocks 660 / 860
    kept = decide_predictive(RULES, PREDICTIVE, seen(12, 790.0, ready=10), PoolSignals(
        wobbly, SEEN * 2, starting_age_s=(235.0, 200.0)), covered(0))
    assert (kept.replicas, kept.reason) == (11, "StartingPodsKept")
    released = decide_predictive(RULES, PREDICTIVE, seen(12, 600.0, ready=10), PoolSignals(
        (600.0,) * 240, SEEN * 2, starting_age_s=(5.0, 5.0)), covered(10))
    assert (released.replicas, released.reason) == (10, "ScaledDown")  # the window keeps the ready ones


def test_the_decision_reports_the_forecast_and_why():
    decision = decide_predictive(RULES, PREDICTIVE, seen(6, 479.0), PoolSignals(ramp(240.0, 1.0), (120.0,) * 3),
                                 covered(0))
    assert decision.forecast_qps == pytest.approx(599.0)
    assert decision.forecast_horizon_s == 120.0
    assert "forecast 599.0 in 120s (median start-up of 3 pods; trend +1.00 QPS/s)" in decision.message
    assert decision.message.endswith("6 requested (6 ready) -> 8")


def test_missing_or_stale_qps_holds_whatever_the_queue_and_trend_say():
    loud = PoolSignals(ramp(240.0, 5.0), (60.0,), waiting=10_000)
    missing = decide_predictive(RULES, PREDICTIVE, seen(5, None, age=None), loud)
    stale = decide_predictive(RULES, PREDICTIVE, seen(5, 2000.0, age=120.0), loud)
    assert (missing.replicas, missing.reason) == (5, "QpsMissing")
    assert (stale.replicas, stale.reason) == (5, "QpsStale")


SLO = PredictiveRules(ttft_slo_s=2.0)


@pytest.mark.parametrize("predictive, replicas, qps, ttft, expected, reason", [
    # first tokens take longer than the SLO with every planned pod ready: one more pod
    (SLO, 6, 470.0, 3.0, 7, "ScaledUpForLatency"),
    # ... and while the plan still lacks a ready pod, it hedges as the queue guard does
    (SLO, 6, 530.0, 3.0, 10, "LatencyGuard"),
    # within the SLO, without a first token lately, or with no SLO set: nothing changes
    (SLO, 6, 470.0, 1.5, 6, "Steady"),
    (SLO, 6, 470.0, None, 6, "Steady"),
    (PREDICTIVE, 6, 470.0, 30.0, 6, "Steady"),
])
def test_the_latency_guard_adds_when_first_tokens_miss_the_slo(predictive, replicas, qps, ttft, expected, reason):
    decision = decide_predictive(RULES, predictive, seen(replicas, qps),
                                 PoolSignals((qps,) * 240, SEEN, ttft_p95_s=ttft), covered(0))
    assert (decision.replicas, decision.reason) == (expected, reason)
    assert ttft is None or predictive.ttft_slo_s is None or f"TTFT p95 {ttft:.2f}s (SLO 2s)" in decision.message


def test_without_engine_heartbeats_the_queue_guard_is_off():
    decision = decide_predictive(RULES, PREDICTIVE, seen(6, 530.0), PoolSignals((530.0,) * 240, waiting=None),
                                 covered(0))
    assert decision.replicas == 7


def test_it_scales_down_once_load_has_fallen_for_a_window():
    replicas, history = 12, covered(12, now=0.0)
    for now in range(0, 400, 5):
        decision = decide_predictive(RULES, PREDICTIVE, seen(replicas, 200.0, now=float(now)),
                                     PoolSignals((200.0,) * 240, (150.0,) * 4), history)
        replicas, history = decision.replicas, decision.history
        if now < 290:
            assert replicas == 12
    assert replicas == 3


def test_rules_refuse_nonsense():
    with pytest.raises(ValueError, match="min_points"):
        PredictiveRules(fit_window_s=10, min_points=20)
    with pytest.raises(ValueError, match="negative"):
        PredictiveRules(over_capacity_pod_s=-1)
    with pytest.raises(ValueError, match="block_s"):
        PredictiveRules(block_s=0)
    with pytest.raises(ValueError, match="sizing_sigmas"):
        PredictiveRules(sizing_sigmas=-1.0)
    with pytest.raises(ValueError, match="down_tolerance"):
        PredictiveRules(down_tolerance=1.0)
    with pytest.raises(ValueError, match="queue_per_replica"):
        PredictiveRules(queue_per_replica=0)
    with pytest.raises(ValueError, match="ttft_slo_s"):
        PredictiveRules(ttft_slo_s=-1.0)


series = st.lists(st.one_of(st.none(), st.floats(0, 5000)), min_size=0, max_size=240).map(tuple)
signals = st.builds(PoolSignals, qps_series=series, startup_s=st.lists(st.floats(0, 600), max_size=5).map(tuple),
                    waiting=st.one_of(st.none(), st.integers(0, 10_000)), unschedulable=st.integers(0, 3),
                    ttft_p95_s=st.one_of(st.none(), st.floats(0, 60)))
observations = st.builds(
    lambda replicas, ready, qps, now: seen(replicas, qps, ready=min(ready, replicas), now=now),
    st.integers(0, 25), st.integers(0, 25), st.floats(0, 5000), st.floats(0, 10_000))
histories = st.lists(st.builds(Recommendation, st.floats(0, 10_000), st.integers(0, 30)), max_size=5).map(
    lambda h: tuple(sorted(h, key=lambda r: r.at)))


@settings(max_examples=300, deadline=None)
@given(observations, signals, histories, st.integers(0, 5), st.integers(1, 25))
def test_never_outside_the_bounds_nor_growing_while_pods_wait_for_nodes(observation, signal, history, low, span):
    rules = ScalingRules(min_replicas=low, max_replicas=low + span)
    for predictive in (PREDICTIVE, SLO):
        decision = decide_predictive(rules, predictive, observation, signal, history)
        assert rules.min_replicas <= decision.replicas <= rules.max_replicas
        if signal.unschedulable:
            assert decision.replicas <= max(observation.replicas, rules.min_replicas)


@settings(max_examples=300, deadline=None)
@given(observations, signals, histories)
def test_the_guards_only_add(observation, signal, history):
    """Against the same policy fed the same signals but no queue and no TTFT: never fewer replicas."""
    for predictive in (PREDICTIVE, SLO):
        bare = decide_predictive(RULES, predictive, observation,
                                 dataclasses.replace(signal, waiting=None, ttft_p95_s=None), history)
        full = decide_predictive(RULES, predictive, observation, signal, history)
        assert full.replicas >= bare.replicas


@settings(max_examples=200, deadline=None)
@given(observations, signals, histories)
def test_missing_qps_always_holds_within_the_bounds(observation, signal, history):
    missing = PoolObservation(observation.now, observation.replicas, observation.ready_replicas, None, None)
    decision = decide_predictive(RULES, PREDICTIVE, missing, signal, history)
    assert decision.reason == "QpsMissing"
    assert decision.replicas == min(max(observation.replicas, RULES.min_replicas), RULES.max_replicas)


def test_the_reactive_policy_is_what_it_builds_on():
    """Without a trend, a queue, or a smaller pool that fits within half the tolerance, the
    predictive plan is the reactive one."""
    for replicas, qps in ((4, 4 * 95.0), (10, 10 * 45.0), (3, 0.0)):
        reactive = decide(RULES, seen(replicas, qps), covered(0))
        predictive = decide_predictive(RULES, PREDICTIVE, seen(replicas, qps), PoolSignals((qps,) * 240), covered(0))
        assert predictive.replicas == reactive.replicas == max(1, math.ceil(qps / 80))


@settings(max_examples=200, deadline=None)
@given(qps=st.floats(min_value=1e-6, max_value=80.0), waiting=st.none() | st.integers(0, 50),
       series=st.lists(st.none() | st.floats(0.0, 80.0), max_size=240))
def test_any_demand_wakes_a_pool_at_zero_with_one_replica(qps, waiting, series):
    """Both policies, whatever the series and queues say: a pool at zero with QPS above zero
    gets one replica (and nothing divides by its zero replicas)."""
    rules = ScalingRules(min_replicas=0, max_replicas=8)
    at_zero = seen(0, qps)
    signals = PoolSignals(qps_series=tuple(series), waiting=waiting)
    assert decide(rules, at_zero, covered(0)).replicas == 1
    assert decide_predictive(rules, PREDICTIVE, at_zero, signals, covered(0)).replicas == 1
    assert decide_predictive(rules, PREDICTIVE, seen(0, 0.0), PoolSignals(), covered(0)).replicas == 0
