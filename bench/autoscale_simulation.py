"""Simulated time for comparing autoscalers: the same request trace and the same pool of
GPU pods (each takes 60-300 s to become ready, then serves a fixed QPS) driven once by
K25's policy and once by the Kubernetes HPA algorithm.

Each simulated second: requests arrive and ready pods serve up to their capacity; every
`period_s` the autoscaler reads the mean QPS of the last `qps_window_s` seconds (what
`common.redis_keys.pool_qps` returns to the operator) and sets the replica count. A
scale-down removes pods that are still starting before ready ones, newest first, as a
ReplicaSet does. A pod holds its GPUs from creation to removal.
"""

import bisect
from dataclasses import dataclass, field

import numpy as np

from bench.hpa_model import HorizontalPodAutoscaler
from bench.load_trace import TraceShape, request_counts
from operators.autoscale_policy import PoolObservation, Recommendation, ScalingRules, decide

K25_PERIOD_S = 5.0  # the operator's autoscaling timer


@dataclass(frozen=True)
class CapacityModel:
    pod_qps: float = 100.0  # what one ready pod serves; the target (80) leaves headroom
    start_s: tuple[float, float] = (60.0, 300.0)  # creation to ready, uniform
    gpus_per_pod: int = 1
    min_replicas: int = 2
    max_replicas: int = 64
    target_qps_per_pod: float = 80.0
    qps_window_s: int = 10


@dataclass
class Outcome:
    seconds_over_capacity: int  # seconds in which requests arrived beyond what ready pods serve
    requests_over_capacity: int
    gpu_hours: float
    scale_events: int
    replicas: np.ndarray = field(repr=False)  # per second: pods requested (ready and starting)
    ready: np.ndarray = field(repr=False)

    def summary(self) -> dict:
        return {
            "seconds_over_capacity": self.seconds_over_capacity,
            "requests_over_capacity": self.requests_over_capacity,
            "gpu_hours": round(self.gpu_hours, 2),
            "scale_events": self.scale_events,
        }


class K25Autoscaler:
    """Our policy with the operator's loop around it, which keeps the recommendation history."""

    def __init__(self, rules: ScalingRules, period_s: float = K25_PERIOD_S):
        self.rules, self.period_s = rules, period_s
        self.history: tuple[Recommendation, ...] = ()

    def step(self, now: float, qps: float, replicas: int, ready: int) -> int:
        decision = decide(self.rules, PoolObservation(now, replicas, ready, qps, qps_age_s=1.0), self.history)
        self.history = decision.history
        return decision.replicas


class HpaAutoscaler:
    """The HPA sees the Deployment's status.replicas: every pod that exists, ready or not."""

    def __init__(self, hpa: HorizontalPodAutoscaler):
        self.hpa, self.period_s = hpa, hpa.period_s

    def step(self, now: float, qps: float, replicas: int, ready: int) -> int:
        return self.hpa.step(now, qps, spec_replicas=replicas, status_replicas=replicas)


def simulate(counts: np.ndarray, autoscaler, capacity: CapacityModel, seed: int) -> Outcome:
    rng = np.random.default_rng(seed + 1)  # pod start times: the same sequence for every autoscaler
    ready_at: list[float] = [0.0] * capacity.min_replicas  # sorted; the pool starts warm
    replicas = np.zeros(len(counts), dtype=np.int32)
    ready = np.zeros(len(counts), dtype=np.int32)
    next_sync = float(capacity.qps_window_s)
    for now in range(len(counts)):
        n_ready = bisect.bisect_right(ready_at, now)
        if now >= next_sync:
            qps = float(counts[now - capacity.qps_window_s:now].mean())
            wanted = autoscaler.step(float(now), qps, len(ready_at), n_ready)
            if wanted > len(ready_at):
                for _ in range(wanted - len(ready_at)):
                    bisect.insort(ready_at, now + rng.uniform(*capacity.start_s))
            del ready_at[wanted:]  # starting pods first, then the most recently ready
            n_ready = bisect.bisect_right(ready_at, now)
            next_sync = now + autoscaler.period_s
        replicas[now], ready[now] = len(ready_at), n_ready
    excess = counts - ready * capacity.pod_qps
    return Outcome(
        seconds_over_capacity=int((excess > 0).sum()),
        requests_over_capacity=int(excess[excess > 0].sum()),
        gpu_hours=float(replicas.sum()) * capacity.gpus_per_pod / 3600,
        scale_events=int(np.count_nonzero(np.diff(replicas))),
        replicas=replicas,
        ready=ready,
    )


def rules_for(capacity: CapacityModel, **overrides) -> ScalingRules:
    return ScalingRules(min_replicas=capacity.min_replicas, max_replicas=capacity.max_replicas,
                        target_qps_per_replica=capacity.target_qps_per_pod, **overrides)


def hpa_for(capacity: CapacityModel) -> HorizontalPodAutoscaler:
    return HorizontalPodAutoscaler(min_replicas=capacity.min_replicas, max_replicas=capacity.max_replicas,
                                   target_per_pod=capacity.target_qps_per_pod)


def compare(seed: int, shape: TraceShape = TraceShape(),
            capacity: CapacityModel = CapacityModel()) -> tuple[np.ndarray, dict[str, Outcome]]:
    """Requests per second and each autoscaler's outcome on them."""
    counts = request_counts(shape, seed)
    return counts, {
        "k25": simulate(counts, K25Autoscaler(rules_for(capacity)), capacity, seed),
        "hpa": simulate(counts, HpaAutoscaler(hpa_for(capacity)), capacity, seed),
    }
