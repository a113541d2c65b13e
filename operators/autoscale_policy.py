"""The autoscaling decision for one EnginePool: a pure function of what the operator
observed, the pool's rules and the recent recommendations. No Kubernetes, no Redis.

The recommendation is ceil(QPS / target per replica), counted against all requested
replicas (ready and starting), so the pool scales out as soon as the load passes the
target. It then goes through, in order:
- tolerance: no scale-down while the load is within 10% below the pool's target
  (hysteresis, so a load that hovers at a boundary does not flap);
- cooldown: while pods are still starting, a scale-up also needs the load to be more than
  10% above what the requested pods will serve, so slow GPU starts do not pile up pods
  for load that is already on its way to being served;
- clamping to [min, max];
- stabilisation (Kubernetes HPA's rule): up to the lowest recommendation of the scale-up
  window, down to the highest of the scale-down window;
- a step limit: one scale-up at most doubles the pool.
Pods that are still starting and that the load no longer needs are released at once: the
scale-down window protects serving capacity, and a pod that is not ready yet serves
nothing. Missing or stale QPS data holds the current size and says so.
"""

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ScalingRules:
    min_replicas: int
    max_replicas: int
    target_qps_per_replica: float = 80.0
    tolerance: float = 0.10
    scale_up_window_s: float = 0.0
    scale_down_window_s: float = 300.0
    max_step_factor: float = 2.0  # a scale-up at most doubles the pool
    stale_after_s: float = 30.0  # QPS data older than this is not acted upon

    def __post_init__(self):
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"need 0 <= minReplicas <= maxReplicas, got {self.min_replicas} and {self.max_replicas}")
        if not self.target_qps_per_replica > 0:
            raise ValueError(f"targetQPSPerReplica must be positive, got {self.target_qps_per_replica}")
        if not 0 <= self.tolerance < 1:
            raise ValueError(f"tolerance must be in [0, 1), got {self.tolerance}")
        if self.scale_up_window_s < 0 or self.scale_down_window_s < 0:
            raise ValueError("stabilisation windows must not be negative")
        if not self.max_step_factor > 1:
            raise ValueError(f"max_step_factor must be above 1, got {self.max_step_factor}")
        if not self.stale_after_s > 0:
            raise ValueError(f"stale_after_s must be positive, got {self.stale_after_s}")


@dataclass(frozen=True)
class PoolObservation:
    now: float  # seconds; any origin, the same as the history's
    replicas: int  # the Deployment's spec.replicas: ready and starting pods
    ready_replicas: int
    qps: float | None  # requests per second to the pool; None: no data
    qps_age_s: float | None  # age of the newest QPS data; None: none at all

    @property
    def starting(self) -> int:
        return max(0, self.replicas - self.ready_replicas)


@dataclass(frozen=True)
class Recommendation:
    at: float
    replicas: int


@dataclass(frozen=True)
class ScalingDecision:
    replicas: int
    reason: str  # CamelCase, for the pool's condition
    message: str
    history: tuple[Recommendation, ...]  # pass it back in on the next call
    forecast_qps: float | None = None  # the predictive policy's expected load at its horizon
    forecast_horizon_s: float | None = None

    @property
    def lacks_data(self) -> bool:
        return self.reason in ("QpsMissing", "QpsStale")


def decide(rules: ScalingRules, seen: PoolObservation, history: tuple[Recommendation, ...] = ()) -> ScalingDecision:
    current = seen.replicas
    if seen.qps is None or seen.qps_age_s is None or seen.qps_age_s > rules.stale_after_s:
        return _hold_without_data(rules, seen, history)

    wanted = math.ceil(seen.qps / rules.target_qps_per_replica)
    recommended = _clamp(rules, _within_tolerance(rules, seen, wanted))
    history = _prune(rules, seen.now, history) + (Recommendation(seen.now, recommended),)
    stabilised = _stabilise(rules, seen.now, current, history)

    if stabilised > current:
        limit = max(math.floor(current * rules.max_step_factor), current + 1)
        replicas, reason = (limit, "ScaleUpLimited") if stabilised > limit else (stabilised, "ScaledUp")
    elif stabilised < current:
        replicas, reason = stabilised, "ScaledDown"
    elif seen.starting and recommended < current and _ready_pods_carry(rules, seen):
        replicas, reason = max(seen.ready_replicas, recommended), "StartingPodsReleased"
    else:
        replicas, reason = current, _why_hold(rules, seen, wanted, recommended)
    if _clamp(rules, replicas) != replicas:  # the bounds win over the step limit and the windows
        replicas, reason = _clamp(rules, replicas), "ClampedToBounds"
    return ScalingDecision(replicas, reason, _describe(rules, seen, wanted, replicas), history)


def _why_hold(rules: ScalingRules, seen: PoolObservation, wanted: int, recommended: int) -> str:
    current = seen.replicas
    if recommended < current:
        return "ScaleDownStabilising"
    if recommended > current:
        return "ScaleUpStabilising"
    if wanted > current >= rules.max_replicas:
        return "AtMaxReplicas"
    if wanted < current <= rules.min_replicas:
        return "AtMinReplicas"
    if wanted > current and seen.starting:
        return "PodsStarting"
    return "WithinTolerance" if wanted != current else "Steady"


def _within_tolerance(rules: ScalingRules, seen: PoolObservation, wanted: int) -> int:
    current = seen.replicas
    if current == 0:
        return wanted
    load = seen.qps / (current * rules.target_qps_per_replica)
    if wanted < current and load >= 1 - rules.tolerance:
        return current
    if wanted > current and seen.starting and load <= 1 + rules.tolerance:
        return current  # the cooldown: the pods on their way will serve this
    return wanted


def _ready_pods_carry(rules: ScalingRules, seen: PoolObservation) -> bool:
    """The ready pods alone serve the load below target, by half the tolerance (so that a
    released pod is not asked for again at the next wobble of the load). No ready pod carries
    anything: a pool woken from zero keeps its first pod while it starts, though the QPS of
    its first requests, which wait for that pod, has left the window."""
    return seen.ready_replicas > 0 and seen.qps <= seen.ready_replicas * rules.target_qps_per_replica * (1 - rules.tolerance / 2)


def _stabilise(rules: ScalingRules, now: float, current: int, history: tuple[Recommendation, ...]) -> int:
    """Scale up only as far as every recommendation of the scale-up window agrees, and
    down only as far as every one of the scale-down window agrees."""
    latest = history[-1].replicas
    up_floor = min([latest] + [r.replicas for r in history if r.at > now - rules.scale_up_window_s])
    down_window = [latest] + [r.replicas for r in history if r.at > now - rules.scale_down_window_s]
    # until the history covers the scale-down window (after an operator restart, say),
    # the current size counts as one of its recommendations
    if history[0].at > now - rules.scale_down_window_s:
        down_window.append(current)
    return min(max(current, up_floor), max(down_window))


def _prune(rules: ScalingRules, now: float, history: tuple[Recommendation, ...]) -> tuple[Recommendation, ...]:
    keep_from = now - max(rules.scale_up_window_s, rules.scale_down_window_s)
    older = [r for r in history if r.at <= keep_from]
    # the newest recommendation from before the windows proves that they are covered
    return tuple(older[-1:]) + tuple(r for r in history if r.at > keep_from)


def _hold_without_data(rules: ScalingRules, seen: PoolObservation, history) -> ScalingDecision:
    replicas = _clamp(rules, seen.replicas)
    if seen.qps_age_s is None or seen.qps is None and seen.qps_age_s <= rules.stale_after_s:
        reason, message = "QpsMissing", "no QPS data for this pool in Redis; holding the current size"
    else:
        reason, message = "QpsStale", (f"newest QPS data is {seen.qps_age_s:.0f}s old (limit "
                                       f"{rules.stale_after_s:g}s); holding the current size")
    # a hold counts as a recommendation of the current size, so a scale-down after a gap
    # in the data waits for a full window of real data
    history = _prune(rules, seen.now, history) + (Recommendation(seen.now, replicas),)
    return ScalingDecision(replicas, reason, message, history)


def _describe(rules: ScalingRules, seen: PoolObservation, wanted: int, replicas: int) -> str:
    starting = f", {seen.starting} starting" if seen.starting else ""
    return (f"{seen.qps:.1f} QPS, target {rules.target_qps_per_replica:g} per replica: load wants {wanted}; "
            f"{seen.replicas} requested ({seen.ready_replicas} ready{starting}) -> {replicas}")


def _clamp(rules: ScalingRules, replicas: int) -> int:
    return min(max(replicas, rules.min_replicas), rules.max_replicas)
