import json

import numpy as np
import pytest

from bench.autoscale_simulation import CapacityModel, compare, simulate
from bench.load_trace import TraceShape, request_counts, request_rate
from k25.cli import main as k25_main  # noqa: F401  (the CLI must import with this command in it)

SHORT = TraceShape(duration_s=4 * 3600)
EXACT_START = CapacityModel(start_s=(60.0, 60.0), min_replicas=2, qps_window_s=10)


class Fixed:
    """An autoscaler stand-in that asks for a set size once."""

    period_s = 1e9

    def __init__(self, replicas: int):
        self.replicas = replicas

    def step(self, now, qps, replicas, ready):
        return self.replicas


def test_the_trace_is_diurnal_bursty_and_seeded():
    rate = request_rate(TraceShape(), np.random.default_rng(0))
    hourly = rate.reshape(24, 3600).mean(axis=1)
    assert hourly.argmax() in range(12, 17) and hourly.argmin() in (0, 1, 2, 24 - 1)
    assert rate.max() > 1.2 * TraceShape().peak_qps  # bursts on top of the curve
    assert np.array_equal(request_counts(SHORT, 7), request_counts(SHORT, 7))
    assert not np.array_equal(request_counts(SHORT, 7), request_counts(SHORT, 8))


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


def test_a_scale_down_removes_starting_pods_first():
    class UpThenDown(Fixed):
        period_s = 20.0

        def step(self, now, qps, replicas, ready):
            return 4 if now < 20 else 3

    outcome = simulate(np.full(40, 100.0), UpThenDown(0), EXACT_START, seed=0)
    assert outcome.replicas[15] == 4 and outcome.replicas[35] == 3
    assert outcome.ready[35] == 2  # the warm pods stayed; a starting one went


def test_both_autoscalers_see_the_same_trace_and_the_run_is_reproducible():
    counts, first = compare(3, SHORT)
    _, again = compare(3, SHORT)
    assert set(first) == {"k25", "hpa"}
    assert first["k25"].summary() == again["k25"].summary()
    assert first["hpa"].summary() == again["hpa"].summary()
    for outcome in first.values():
        assert len(outcome.replicas) == len(counts)
        assert (outcome.replicas >= CapacityModel().min_replicas).all()
        assert (outcome.ready <= outcome.replicas).all()


def test_simulate_command_prints_json_for_both(capsys, tmp_path):
    plot = tmp_path / "replicas.png"
    assert k25_main(["simulate", "--days", "0.05", "--seed", "1", "--json", "--plot", str(plot)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert set(printed) == {"k25", "hpa"}
    for summary in printed.values():
        assert {"seconds_over_capacity", "gpu_hours", "scale_events"} <= set(summary)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_command_prints_a_side_by_side_table(capsys):
    assert k25_main(["simulate", "--days", "0.02"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["k25", "hpa"]
    assert lines[1].startswith("seconds over capacity")


def test_simulate_command_refuses_a_trace_without_length():
    with pytest.raises(SystemExit, match="--days"):
        k25_main(["simulate", "--days", "0"])
