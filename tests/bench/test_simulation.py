import json

import numpy as np
import pytest

from bench.autoscale_simulation import (POLICIES, CapacityModel, HpaAutoscaler, PoolView, QueueDepthAutoscaler,
                                        autoscaler_for, compare, hpa_for, simulate)
from bench.load_trace import DAY_S, TRACES, TraceShape, request_counts, request_rate, trace_rate
from k25.cli import main as k25_main  # noqa: F401  (the CLI must import with this command in it)

EXACT_START = CapacityModel(start_s=(60.0, 60.0), min_replicas=2, qps_window_s=10)
HOUR = 3600


class Fixed:
    """An autoscaler stand-in that asks for a set size and remembers what it saw."""

    period_s = 1e9

    def __init__(self, replicas: int):
        self.replicas, self.views = replicas, []

    def step(self, view):
        self.views.append(view)
        return self.replicas


def test_the_diurnal_trace_is_diurnal_bursty_and_seeded():
    rate = request_rate(TraceShape(), np.random.default_rng(0))
    hourly = rate.reshape(24, 3600).mean(axis=1)
    assert hourly.argmax() in range(12, 17) and hourly.argmin() in (0, 1, 2, 24 - 1)
    assert rate.max() > 1.2 * TraceShape().peak_qps  # bursts on top of the curve
    assert np.array_equal(request_counts("diurnal", 4 * HOUR, 7), request_counts("diurnal", 4 * HOUR, 7))
    assert not np.array_equal(request_counts("diurnal", 4 * HOUR, 7), request_counts("diurnal", 4 * HOUR, 8))


def minutes(rate):
    return rate[: len(rate) // 60 * 60].reshape(-1, 60).mean(axis=1)


def test_each_shape_looks_like_its_name():
    def shape(name, seed=3):
        return minutes(trace_rate(name, DAY_S // 4, np.random.default_rng(seed)))

    ramp = shape("morning-ramp")
    assert ramp[0] == pytest.approx(150, abs=1) and ramp[-1] > 1_000 and (np.diff(ramp) >= -1e-9).all()
    step = shape("step")
    jumps = np.flatnonzero(np.diff(step) > 1)
    assert len(jumps) <= 2 and step[-1] >= 2 * step[0]  # one jump (it may fall inside a minute)
    crowd = shape("flash-crowd")
    assert crowd.max() >= 3 * crowd[0] and crowd[-1] == pytest.approx(crowd[0])
    rise = np.flatnonzero(crowd > crowd[0] * 1.01)
    assert crowd[rise[0] + 1] > 2 * crowd[0]  # several-fold within a minute or so
    decline = shape("slow-decline")
    assert (np.diff(decline) < 0).all() and decline[-1] < decline[0] / 4
    noise = shape("noise")
    halves = noise[: len(noise) // 2].mean(), noise[len(noise) // 2:].mean()
    assert abs(halves[0] - halves[1]) < 0.1 * noise.mean()  # no trend
    assert noise.std() > 0.03 * noise.mean()  # but wobbles


def test_an_unknown_trace_is_refused():
    with pytest.raises(ValueError, match="unknown trace 'sawtooth'"):
        trace_rate("sawtooth", 60, np.random.default_rng(0))


def test_seconds_and_requests_over_capacity_count_what_ready_pods_cannot_serve():
    counts = np.full(100, 250.0)  # two warm pods serve 200
    outcome = simulate(counts, Fixed(2), EXACT_START, seed=0)
    assert (outcome.seconds_over_capacity, outcome.requests_over_capacity) == (100, 5000)
    assert outcome.gpu_hours == pytest.approx(2 * 100 / 3600)
    assert outcome.scale_events == 0


def test_a_new_pod_serves_only_once_it_is_ready():
    counts = np.full(200, 250.0)
    outcome = simulate(counts, Fixed(3), EXACT_START, seed=0)  # asks at t=10, ready at t=70
    assert outcome.seconds_over_capacity == 70
    assert outcome.replicas[10] == 3 and outcome.ready[69] == 2 and outcome.ready[70] == 3
    assert outcome.scale_events == 1


def test_what_ready_pods_cannot_serve_waits_up_to_each_pods_queue_limit():
    capacity = CapacityModel(start_s=(60.0, 60.0), min_replicas=2, max_waiting_per_pod=100)

    class Twice(Fixed):
        period_s = 1.0

    watcher = Twice(2)
    simulate(np.array([200.0] * 10 + [230.0] * 5 + [250.0] * 10 + [150.0] * 5), watcher, capacity, seed=0)
    waiting = {int(view.now): view.waiting for view in watcher.views}
    assert waiting[10] == 0 and waiting[15] == 150  # 30 a second beyond 200
    assert waiting[25] == 200  # the two queues are full: the rest is refused
    assert waiting[29] == 0  # drained once the load fell below what the pods serve


def test_the_view_carries_the_series_and_the_ready_pods_start_ups():
    watcher = Fixed(2)
    simulate(np.arange(30, dtype=float), watcher, EXACT_START, seed=0)
    view = watcher.views[0]
    assert view.now == 10 and view.qps == pytest.approx(4.5)
    assert list(view.counts) == list(range(10))
    assert len(view.startup_s) == 2 and all(s == 60.0 for s in view.startup_s)


def test_a_scale_down_removes_starting_pods_first_newest_first():
    class UpThenDown(Fixed):
        period_s = 20.0

        def step(self, view):
            return {10: 4, 30: 6}.get(int(view.now), 5)

    outcome = simulate(np.full(100, 100.0), UpThenDown(0), EXACT_START, seed=0)
    assert list(outcome.replicas[[15, 35, 55]]) == [4, 6, 5]
    assert outcome.ready[55] == 2  # the warm pods stayed; a starting one went...
    assert outcome.ready[75] == 4  # ...one of the two started at t=30, not those of t=10 (ready at 70)
    assert outcome.ready[95] == 5
    assert (outcome.pods_created, outcome.released_before_ready) == (4, 1)
    assert outcome.released_gpu_hours == pytest.approx(20 / 3600)  # created at t=30, removed at t=50


def test_the_view_carries_the_ages_of_starting_pods_and_ready_pods_released_are_not_counted():
    class UpThenDown(Fixed):
        period_s = 20.0

        def step(self, view):
            self.views.append(view)
            return {10: 4, 90: 2}.get(int(view.now), view.replicas)

    watcher = UpThenDown(0)
    outcome = simulate(np.full(120, 100.0), watcher, EXACT_START, seed=0)
    ages = {int(view.now): view.starting_age_s for view in watcher.views}
    assert ages[10] == () and ages[30] == (20.0, 20.0) and ages[70] == ()
    assert (outcome.pods_created, outcome.released_before_ready) == (2, 0)  # removed at t=90, ready since t=70
    assert outcome.released_gpu_hours == 0


def test_the_queue_depth_baseline_scales_on_waiting_requests_per_replica():
    scaler = QueueDepthAutoscaler(hpa_for(CapacityModel(), target_per_pod=10.0))
    view = PoolView(now=0.0, qps=10_000.0, replicas=4, ready=4, counts=np.zeros(0), startup_s=(), waiting=80)
    assert scaler.step(view) == 8  # 80 waiting at 10 per pod; the QPS does not count
    hpa = HpaAutoscaler(hpa_for(CapacityModel()))
    assert hpa.step(view) == 8  # the QPS HPA sees 10,000 QPS but may only double


def test_every_policy_sees_the_same_trace_and_the_run_is_reproducible():
    counts, first = compare("step", HOUR, 3)
    _, again = compare("step", HOUR, 3)
    assert set(first) == set(POLICIES)
    for policy, outcome in first.items():
        assert outcome.summary() == again[policy].summary()
        assert len(outcome.replicas) == len(counts)
        assert (outcome.replicas >= CapacityModel().min_replicas).all()
        assert (outcome.ready <= outcome.replicas).all()
    with pytest.raises(ValueError, match="unknown policy"):
        autoscaler_for("magic", CapacityModel())


def test_on_a_morning_ramp_the_predictive_policy_has_pods_ready_sooner_than_the_reactive_one():
    counts = np.concatenate([np.full(600, 400.0), 400.0 + 2.0 * np.arange(1200)])  # +2 QPS a second
    slow = CapacityModel(start_s=(300.0, 300.0))  # the warm pods' start-ups teach the horizon
    outcomes = {p: simulate(counts, autoscaler_for(p, slow), slow, seed=0)
                for p in ("predictive", "reactive")}
    assert outcomes["predictive"].seconds_over_capacity < outcomes["reactive"].seconds_over_capacity


def test_simulate_command_prints_json_for_each_seed_and_the_total(capsys, tmp_path):
    plot = tmp_path / "replicas.png"
    assert k25_main(["simulate", "--trace", "flash-crowd", "--days", "0.02", "--seed", "1", "--seeds", "2",
                     "--workers", "1", "--json", "--plot", str(plot)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert set(printed) == {"1", "2", "total", "spread"}
    for policy in POLICIES:
        summed = sum(printed[seed][policy]["seconds_over_capacity"] for seed in ("1", "2"))
        assert printed["total"][policy]["seconds_over_capacity"] == summed
        assert {"requests_over_capacity", "gpu_hours", "scale_events", "released_before_ready",
                "released_gpu_hours", "pods_created"} <= set(printed["1"][policy])
        seconds = [printed[seed][policy]["seconds_over_capacity"] for seed in ("1", "2")]
        spread = printed["spread"][policy]["seconds_over_capacity"]
        assert spread["worst"] == max(seconds) and spread["median"] == sum(seconds) / 2
        assert printed[str(spread["worst_seed"])][policy]["seconds_over_capacity"] == max(seconds)
    assert printed["total"]["hpa"]["gpu_hours_vs_hpa"] == 1.0
    assert printed["1"]["predictive"]["seconds_vs_hpa"] == round(
        printed["1"]["predictive"]["seconds_over_capacity"] / printed["1"]["hpa"]["seconds_over_capacity"], 3)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_command_runs_seeds_in_parallel_with_the_same_figures(capsys):
    flags = ["simulate", "--trace", "step", "--days", "0.01", "--seeds", "2", "--policies", "predictive,hpa", "--json"]
    assert k25_main([*flags, "--workers", "1"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert k25_main([*flags, "--workers", "2"]) == 0
    assert json.loads(capsys.readouterr().out) == alone
    assert set(alone["1"]) == {"predictive", "hpa"}


def test_simulate_command_runs_the_policy_as_a_git_revision_had_it_beside_this_one(capsys):
    assert k25_main(["simulate", "--trace", "step", "--days", "0.01", "--policies", "hpa", "--against", "HEAD",
                     "--json"]) == 0
    assert set(json.loads(capsys.readouterr().out)["0"]) == {"hpa", "predictive@HEAD"}


def test_simulate_command_prints_a_side_by_side_table(capsys):
    assert k25_main(["simulate", "--trace", "noise", "--days", "0.02"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "trace noise, 0.02 days per seed"
    assert lines[3].split() == list(POLICIES)
    assert lines[4].startswith("seconds over capacity")


@pytest.mark.parametrize("flags, message", [
    (["--days", "0"], "--days"), (["--seeds", "0"], "--seeds"), (["--workers", "0"], "--workers"),
    (["--policies", "predictive,magic"], "unknown policy magic"),
    (["--against", "no-such-revision"], "--against: cannot read"), (["--against=-x"], "not a git revision"),
])
def test_simulate_command_refuses_nonsense(flags, message):
    with pytest.raises(SystemExit, match=message):
        k25_main(["simulate", *flags])


def test_every_trace_is_a_choice_of_the_command():
    with pytest.raises(SystemExit):
        k25_main(["simulate", "--trace", "sawtooth"])
    assert TRACES == ("diurnal", "morning-ramp", "step", "flash-crowd", "slow-decline", "noise")
