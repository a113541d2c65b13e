"""Simulated time for comparing autoscalers: the same request trace and the same pool of
GPU pods (each takes 60-300 s to become ready, then serves a fixed QPS) driven by each
autoscaler in turn: K25's predictive policy (the default), its reactive one, the
Kubernetes HPA on QPS and queue-depth scaling as KEDA setups run it.

Each simulated second: requests arrive and ready pods serve up to their capacity; what
they cannot serve waits in the engines' queues (up to `max_waiting_per_pod` each, the rest
is refused). Every `period_s` an autoscaler sees the pool (`PoolView`: the mean QPS of the
last `qps_window_s` seconds as `common.redis_keys.pool_qps` gives it to the operator, the
per-second series, the start-up times of the pods that exist, the ages of those still
starting, the waiting requests) and sets the replica count. A scale-down removes pods that
are still starting before ready ones, newest first, as a ReplicaSet does; such a pod was
paid for and never served (`released_before_ready`; `released_gpu_hours`, what such pods held).
A pod holds its GPUs from creation to removal.
"""

import bisect
import dataclasses
import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from bench.hpa_model import HorizontalPodAutoscaler
from bench.load_trace import request_counts
from bench.policy_at_revision import predictive_policy_at
from operators import predictive_policy
from operators.autoscale_policy import PoolObservation, Recommendation, ScalingRules, decide

K25_PERIOD_S = 5.0  # the operator's autoscaling timer
POLICIES = ("predictive", "reactive", "hpa", "queue-depth")


@dataclass(frozen=True)
class CapacityModel:
    pod_qps: float = 100.0  # what one ready pod serves; the target (80) leaves headroom
    start_s: tuple[float, float] = (60.0, 300.0)  # creation to ready, uniform
    gpus_per_pod: int = 1
    min_replicas: int = 2
    max_replicas: int = 64
    target_qps_per_pod: float = 80.0
    qps_window_s: int = 10
    max_waiting_per_pod: int = 256
    keda_waiting_per_pod: float = 10.0  # the queue-depth baseline's target


@dataclass(frozen=True)
class PoolView:
    """What an autoscaler sees at one sync."""
    now: float
    qps: float  # mean of the last qps_window_s seconds
    replicas: int  # requested: ready and starting
    ready: int
    counts: np.ndarray  # requests in each second so far, oldest first
    startup_s: tuple[float, ...]  # creation to ready of the pods that exist and are ready
    waiting: int  # requests waiting in the ready pods' queues
    starting_age_s: tuple[float, ...] = ()  # since creation, of the pods not ready yet


@dataclass
class Outcome:
    seconds_over_capacity: int  # seconds in which requests arrived beyond what ready pods serve
    requests_over_capacity: int
    gpu_hours: float
    scale_events: int
    released_before_ready: int  # pods removed while still starting: GPU time that served nothing
    released_gpu_hours: float  # what those pods held from creation to removal
    pods_created: int
    replicas: np.ndarray = field(repr=False)  # per second: pods requested (ready and starting)
    ready: np.ndarray = field(repr=False)

    def summary(self) -> dict:
        return {
            "seconds_over_capacity": self.seconds_over_capacity,
            "requests_over_capacity": self.requests_over_capacity,
            "gpu_hours": round(self.gpu_hours, 2),
            "scale_events": self.scale_events,
            "released_before_ready": self.released_before_ready,
            "released_gpu_hours": round(self.released_gpu_hours, 2),
            "pods_created": self.pods_created,
        }


class ReactiveAutoscaler:
    """Today's policy with the operator's loop around it, which keeps the recommendation history."""

    def __init__(self, rules: ScalingRules, period_s: float = K25_PERIOD_S):
        self.rules, self.period_s = rules, period_s
        self.history: tuple[Recommendation, ...] = ()

    def step(self, view: PoolView) -> int:
        decision = decide(self.rules, _observation(view), self.history)
        self.history = decision.history
        return decision.replicas


class PredictiveAutoscaler:
    """The predictive policy; `policy` may be another version of its module (a git revision's, to
    compare against), which is given only the signals its `PoolSignals` knows."""

    def __init__(self, rules: ScalingRules, predictive=None, period_s: float = K25_PERIOD_S, policy=predictive_policy):
        self.rules, self.period_s, self.policy = rules, period_s, policy
        self.predictive = predictive or policy.PredictiveRules()
        self.history: tuple[Recommendation, ...] = ()
        self.known = {f.name for f in dataclasses.fields(policy.PoolSignals)}

    def step(self, view: PoolView) -> int:
        series = tuple(view.counts[-self.predictive.fit_window_s:].tolist())
        offered = {"qps_series": series, "startup_s": view.startup_s, "waiting": view.waiting,
                   "starting_age_s": view.starting_age_s}
        signals = self.policy.PoolSignals(**{k: v for k, v in offered.items() if k in self.known})
        decision = self.policy.decide_predictive(self.rules, self.predictive, _observation(view), signals,
                                                 self.history)
        self.history = decision.history
        return decision.replicas


class HpaAutoscaler:
    """The HPA on QPS sees the Deployment's status.replicas: every pod that exists, ready or not."""

    def __init__(self, hpa: HorizontalPodAutoscaler):
        self.hpa, self.period_s = hpa, hpa.period_s

    def step(self, view: PoolView) -> int:
        return self.hpa.step(view.now, view.qps, spec_replicas=view.replicas, status_replicas=view.replicas)


class QueueDepthAutoscaler(HpaAutoscaler):
    """KEDA's way with an engine queue metric (e.g. vLLM's num_requests_waiting): the HPA
    algorithm with an AverageValue target of waiting requests per pod."""

    def step(self, view: PoolView) -> int:
        return self.hpa.step(view.now, float(view.waiting), spec_replicas=view.replicas,
                             status_replicas=view.replicas)


def _observation(view: PoolView) -> PoolObservation:
    return PoolObservation(view.now, view.replicas, view.ready, view.qps, qps_age_s=1.0)


def simulate(counts: np.ndarray, autoscaler, capacity: CapacityModel, seed: int) -> Outcome:
    rng = np.random.default_rng(seed + 1)  # pod start times: the same sequence for every autoscaler
    # (ready_at, created, serial), sorted; the pool starts warm, its pods' start-ups already seen
    serials = itertools.count()
    pods = sorted((0.0, -rng.uniform(*capacity.start_s), next(serials)) for _ in range(capacity.min_replicas))
    replicas = np.zeros(len(counts), dtype=np.int32)
    ready = np.zeros(len(counts), dtype=np.int32)
    waiting = 0.0
    next_sync = float(capacity.qps_window_s)
    released_ages = []
    for now in range(len(counts)):
        n_ready = bisect.bisect_right(pods, (now, math.inf))
        if now >= next_sync:
            view = PoolView(float(now), float(counts[now - capacity.qps_window_s:now].mean()), len(pods), n_ready,
                            counts[:now], tuple(r - c for r, c, _ in pods[:n_ready]), int(waiting),
                            tuple(now - c for _, c, _ in pods[n_ready:]))
            starting = pods[n_ready:]
            pods = _resize(pods, autoscaler.step(view), now, n_ready, capacity, rng, serials)
            n_ready = bisect.bisect_right(pods, (now, math.inf))
            kept = {serial for _, _, serial in pods}
            released_ages += [now - created for _, created, serial in starting if serial not in kept]
            next_sync = now + autoscaler.period_s
        replicas[now], ready[now] = len(pods), n_ready
        waiting = min(max(0.0, waiting + counts[now] - n_ready * capacity.pod_qps),
                      n_ready * capacity.max_waiting_per_pod)
    excess = counts - ready * capacity.pod_qps
    return Outcome(
        seconds_over_capacity=int((excess > 0).sum()),
        requests_over_capacity=int(excess[excess > 0].sum()),
        gpu_hours=float(replicas.sum()) * capacity.gpus_per_pod / 3600,
        scale_events=int(np.count_nonzero(np.diff(replicas))),
        released_before_ready=len(released_ages),
        released_gpu_hours=sum(released_ages) * capacity.gpus_per_pod / 3600,
        pods_created=next(serials) - capacity.min_replicas,
        replicas=replicas,
        ready=ready,
    )


def _resize(pods: list, wanted: int, now: int, n_ready: int, capacity: CapacityModel, rng, serials) -> list:
    """Add pods, or remove them as a ReplicaSet does: starting ones first, newest first
    (among those created in the same second, the last created: nobody knows which will be
    slowest), then the most recently ready."""
    if wanted >= len(pods):
        return sorted(pods + [(now + rng.uniform(*capacity.start_s), float(now), next(serials))
                              for _ in range(wanted - len(pods))])
    starting = sorted(pods[n_ready:], key=lambda pod: (pod[1], pod[2]))  # oldest first
    return sorted(pods[:min(wanted, n_ready)] + starting[:max(0, wanted - n_ready)])


def rules_for(capacity: CapacityModel, **overrides) -> ScalingRules:
    return ScalingRules(min_replicas=capacity.min_replicas, max_replicas=capacity.max_replicas,
                        target_qps_per_replica=capacity.target_qps_per_pod, **overrides)


def hpa_for(capacity: CapacityModel, target_per_pod: float | None = None) -> HorizontalPodAutoscaler:
    return HorizontalPodAutoscaler(min_replicas=capacity.min_replicas, max_replicas=capacity.max_replicas,
                                   target_per_pod=target_per_pod or capacity.target_qps_per_pod)


def autoscaler_for(policy: str, capacity: CapacityModel):
    """One of POLICIES, or "predictive@REVISION": the predictive policy as that git revision has it."""
    if policy == "predictive":
        return PredictiveAutoscaler(rules_for(capacity))
    if policy.startswith("predictive@"):
        return PredictiveAutoscaler(rules_for(capacity), policy=predictive_policy_at(policy.partition("@")[2]))
    if policy == "reactive":
        return ReactiveAutoscaler(rules_for(capacity))
    if policy == "hpa":
        return HpaAutoscaler(hpa_for(capacity))
    if policy == "queue-depth":
        return QueueDepthAutoscaler(hpa_for(capacity, target_per_pod=capacity.keda_waiting_per_pod))
    raise ValueError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")


def compare(trace: str, duration_s: int, seed: int, capacity: CapacityModel = CapacityModel(),
            policies: tuple[str, ...] = POLICIES) -> tuple[np.ndarray, dict[str, Outcome]]:
    """Requests per second and each autoscaler's outcome on them."""
    counts = request_counts(trace, duration_s, seed)
    return counts, {policy: simulate(counts, autoscaler_for(policy, capacity), capacity, seed)
                    for policy in policies}
