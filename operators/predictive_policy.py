"""The predictive autoscaling decision: plan for the load expected when a pod started now
would be ready. A pure function, built on the reactive one; no Kubernetes, no Redis.

- Horizon: the median time the pool's own pods took from creation to ready (a default
  until one was seen ready).
- Forecast: the observed QPS plus a trend times the horizon. The trend counts only when
  both halves of the last `fit_window_s` seconds show it clearly (each half's least-squares
  slope at least `clear_trend` standard errors from zero, both with the same sign); it is
  the smaller of the two. A step or a burst shows in one half only and is not extrapolated;
  a ramp shows in both. The planned load is the larger of the observed QPS and the
  forecast: a falling forecast never removes capacity that the load needs now. Its
  uncertainty: the load's wander and the trend's standard error times the horizon.
- Tolerance: because pods start ahead of the load, a scale-out waits until the planned load
  is more than the pool's tolerance (10%) above its target, as the HPA does. A smaller pool is
  sized to run up to that threshold, less `sizing_sigmas` standard deviations of the load's
  wander over the last `fit_window_s` (the spread of its `block_s`-second means): a steady
  load is served at up to target plus tolerance, as the HPA's band allows, a wandering one
  keeps room for its wander. The scale-down window stabilises it.
- The reactive policy (`autoscale_policy.decide`) then runs on the planned load: cooldown,
  scale-down window, step limit, [min, max], release of starting pods no longer needed, and
  holding when QPS data is missing or stale.
- Queue and latency guards (only add): while more than `queue_per_replica` requests wait per
  ready engine, or the worst engine's TTFT p95 over the last minute is above `ttft_slo_s` (when
  the pool sets an SLO), and every planned pod is ready, the pods serve less than the target
  says, and the plan is one pod more than are ready (the scale-down window then keeps it like
  any plan). While the plan's pods are not all ready, the pool starts as many pods as are worth
  it (`startup_model.pods_to_start`): pods start at spread times, so more of them get the missing
  ones ready sooner; from the start-ups the pool has seen and the ages of the pods already
  starting (their ages count once `trusted_startups` start-ups were seen), it starts the number
  that minimises (`over_capacity_pod_s` + extra pods) x the expected time until the missing
  pods are ready: the price of a second over capacity against the pod-seconds that extra pods
  cost until they are released. Within the step limit and max.
- Cost of a start: a smaller size releases starting pods (the newest first, as a ReplicaSet
  does), but a starting pod is kept while the chance that the forecast load needs it (that it
  would be above the scale-out threshold without it) times the scale-down window it would then
  serve is more than the seconds it still takes to be ready (from the start-ups seen): a pod
  nearly ready is not thrown away for a dip in the load.
- Nodes: while the scheduler reports a pod of the pool Unschedulable, the pool does not
  grow; pods that already wait for a node keep waiting (a cluster autoscaler may add one).
"""

import dataclasses
import math
import statistics
from dataclasses import dataclass

from operators.autoscale_policy import PoolObservation, Recommendation, ScalingDecision, ScalingRules, decide
from operators.startup_model import expected_remaining, pods_to_start

SCALED_UP = ("ScaledUp", "ScaleUpLimited")


@dataclass(frozen=True)
class PredictiveRules:
    fit_window_s: int = 240  # within the gateway's bucket TTL (300 s)
    min_points: int = 20  # seconds with data per half below which there is no trend
    clear_trend: float = 3.0  # standard errors
    default_startup_s: float = 180.0
    down_tolerance: float = 0.0
    queue_per_replica: float | None = 8.0  # None: no queue guard
    ttft_slo_s: float | None = None  # None: no latency guard
    over_capacity_pod_s: float = 60.0  # pod-seconds of start-up worth one second less over capacity
    block_s: int = 10  # the forecast's uncertainty: the spread of the load's means over blocks this long
    sizing_sigmas: float = 6.0  # a smaller pool keeps the load this many standard deviations below its scale-out
    trusted_startups: int = 8  # start-ups seen below which a starting pod's age says nothing about when it is ready

    def __post_init__(self):
        if not 2 <= self.min_points <= self.fit_window_s // 2:
            raise ValueError(f"need 2 <= min_points <= fit_window_s / 2, got {self.min_points} and "
                             f"{self.fit_window_s}")
        if min(self.clear_trend, self.default_startup_s, self.over_capacity_pod_s) < 0:
            raise ValueError("clear_trend, default_startup_s and over_capacity_pod_s must not be negative")
        if not 1 <= self.block_s <= self.fit_window_s // 2:
            raise ValueError(f"need 1 <= block_s <= fit_window_s / 2, got {self.block_s}")
        if self.sizing_sigmas < 0:
            raise ValueError(f"sizing_sigmas must not be negative, got {self.sizing_sigmas}")
        if not 0 <= self.down_tolerance < 1:
            raise ValueError(f"down_tolerance must be in [0, 1), got {self.down_tolerance}")
        for name in ("queue_per_replica", "ttft_slo_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive, got {value}")


@dataclass(frozen=True)
class PoolSignals:
    """What the predictive policy reads besides the reactive observation."""
    qps_series: tuple[float | None, ...] = ()  # requests per second, oldest first, up to the last
    # complete second; None: no data for that second
    startup_s: tuple[float, ...] = ()  # creation to ready, for the pool's pods seen ready
    waiting: int | None = None  # requests waiting in the pool's engines; None: no heartbeat
    ttft_p95_s: float | None = None  # the worst engine's, over the last minute; None: no first token in it
    unschedulable: int = 0  # the pool's pods that the scheduler could not place
    starting_age_s: tuple[float, ...] = ()  # since creation, of the pool's pods not ready yet


@dataclass(frozen=True)
class Forecast:
    qps: float  # expected QPS at the horizon
    horizon_s: float
    trend: float  # QPS per second; 0 when none is clear
    spread: float = 0.0  # its uncertainty (one standard deviation, QPS)


def startup_estimate(predictive: PredictiveRules, samples: tuple[float, ...]) -> float:
    return statistics.median(samples) if samples else predictive.default_startup_s


def forecast(predictive: PredictiveRules, series: tuple[float | None, ...], level: float,
             horizon_s: float) -> Forecast:
    recent = series[-predictive.fit_window_s:]
    half = len(recent) // 2
    halves = [[(x, y) for x, y in enumerate(part) if y is not None] for part in (recent[:half], recent[half:])]
    wobble = _block_spread(recent, predictive.block_s)
    if min(len(points) for points in halves) < predictive.min_points:
        return Forecast(level, horizon_s, 0.0, wobble)
    (first, first_error), (second, second_error) = (_slope(points) for points in halves)
    clear = (abs(first) > predictive.clear_trend * first_error and abs(second) > predictive.clear_trend * second_error
             and first * second > 0)
    trend, error = (min((first, first_error), (second, second_error), key=lambda fit: abs(fit[0])) if clear
                    else (0.0, 0.0))
    return Forecast(max(0.0, level + trend * horizon_s), horizon_s, trend, math.hypot(wobble, error * horizon_s))


def _block_spread(series: tuple[float | None, ...], block_s: int) -> float:
    """How far the load's means over consecutive blocks wander from a straight line through them
    (one standard deviation; blocks without data left out): a ramp is a trend, not a wander."""
    means = []
    for index, start in enumerate(range(0, len(series) - block_s + 1, block_s)):
        values = [v for v in series[start:start + block_s] if v is not None]
        if values:
            means.append((index, sum(values) / len(values)))
    if len(means) < 3:
        return 0.0
    slope, _ = _slope(means)
    mean_x = sum(x for x, _ in means) / len(means)
    mean_y = sum(y for _, y in means) / len(means)
    return math.sqrt(sum((y - mean_y - slope * (x - mean_x)) ** 2 for x, y in means) / (len(means) - 2))


def _slope(points: list[tuple[int, float]]) -> tuple[float, float]:
    """The least-squares slope through the points and its standard error."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread
    residual = sum((y - mean_y - slope * (x - mean_x)) ** 2 for x, y in points)
    return slope, math.sqrt(residual / (n - 2) / spread)


def decide_predictive(rules: ScalingRules, predictive: PredictiveRules, seen: PoolObservation,
                      signals: PoolSignals, history: tuple[Recommendation, ...] = ()) -> ScalingDecision:
    if seen.qps is None:
        return decide(rules, seen, history)  # holds, and says why
    expected = forecast(predictive, signals.qps_series, seen.qps, startup_estimate(predictive, signals.startup_s))
    planned = max(seen.qps, expected.qps)
    serves = seen.replicas * rules.target_qps_per_replica
    if serves < planned <= serves * (1 + rules.tolerance):
        planned = serves  # within the tolerance above target: no scale-out yet
    guard = _guard(predictive, seen, signals)
    # every planned pod is ready and requests still queue (or wait too long): they serve less
    # than the target says, so one pod more than are ready (the one already starting, if any, is kept)
    saturated = guard is not None and math.ceil(planned / rules.target_qps_per_replica) <= seen.ready_replicas
    # the pool scales out only above its target plus the tolerance; a smaller pool is sized so that
    # the load's wander (`sizing_sigmas` of the forecast's spread) does not take it straight back out
    upper = planned + predictive.sizing_sigmas * expected.spread
    sized = min(planned, upper / (1 + rules.tolerance)) if planned < serves else planned
    bumped = max(seen.replicas, seen.ready_replicas + 1) * rules.target_qps_per_replica if saturated else sized
    decision = decide(dataclasses.replace(rules, tolerance=predictive.down_tolerance),
                      dataclasses.replace(seen, qps=bumped), history)
    if decision.lacks_data:
        return decision
    replicas, reason = decision.replicas, decision.reason
    if reason in SCALED_UP and (saturated or expected.qps > seen.qps):
        reason += f"For{guard}" if saturated else "ForForecast"
    samples = sorted(signals.startup_s) or [predictive.default_startup_s]
    hedged = _hedge(rules, predictive, seen, signals, samples, planned) if guard is not None else 0
    if hedged > replicas:
        replicas, reason = hedged, f"{guard}Guard"
    kept = _keep_starting(rules, seen, signals, samples, expected, replicas)
    if kept > replicas:
        replicas, reason = kept, "StartingPodsKept"
    replicas = min(replicas, max(decision.replicas, rules.max_replicas))  # a pool above max is not kept there
    if replicas > max(seen.replicas, rules.min_replicas) and signals.unschedulable:
        replicas, reason = max(seen.replicas, rules.min_replicas), "NodesFull"  # minReplicas still wins
    message = _describe(rules, predictive, seen, signals, expected, bumped, replicas)
    return dataclasses.replace(decision, replicas=replicas, reason=reason, message=message,
                               forecast_qps=expected.qps, forecast_horizon_s=expected.horizon_s)


def _guard(predictive: PredictiveRules, seen: PoolObservation, signals: PoolSignals) -> str | None:
    """The guard that says the pool serves less than its target: "Queue" or "Latency"; None: neither."""
    if (predictive.queue_per_replica is not None and signals.waiting is not None
            and signals.waiting > predictive.queue_per_replica * max(seen.ready_replicas, 1)):
        return "Queue"
    if predictive.ttft_slo_s is not None and signals.ttft_p95_s is not None and signals.ttft_p95_s > predictive.ttft_slo_s:
        return "Latency"
    return None


def _hedge(rules: ScalingRules, predictive: PredictiveRules, seen: PoolObservation, signals: PoolSignals,
           samples: list[float], planned: float) -> int:
    """The pods requested plus those worth starting for the plan's pods not ready yet (see
    `startup_model.pods_to_start`), within the step limit and max."""
    need = min(math.ceil(planned / rules.target_qps_per_replica), rules.max_replicas)
    step_limit = min(max(math.floor(seen.replicas * rules.max_step_factor), seen.replicas + 1), rules.max_replicas)
    ages = _starting_ages(seen, signals) if len(samples) >= predictive.trusted_startups else (0.0,) * seen.starting
    fresh = pods_to_start(samples, ages, need - seen.ready_replicas, predictive.over_capacity_pod_s,
                          max(0, step_limit - seen.replicas))
    return seen.replicas + fresh


def _keep_starting(rules: ScalingRules, seen: PoolObservation, signals: PoolSignals, samples: list[float],
                   expected: Forecast, replicas: int) -> int:
    """Of the starting pods a smaller size would release (the newest first, as a ReplicaSet
    does), keep those whose expected use is worth their cost: a pod is kept while the chance
    that the forecast load needs it, times the scale-down window it would then serve at least,
    is more than the seconds it still takes to be ready."""
    releasing = min(seen.replicas - replicas, seen.starting)
    if releasing <= 0:
        return replicas
    oldest_released = sorted(_starting_ages(seen, signals), reverse=True)[seen.starting - releasing:]
    kept = replicas
    for age in oldest_released:  # without this pod, the plan would start one above this load
        needed = _chance_above(expected, kept * rules.target_qps_per_replica * (1 + rules.tolerance))
        if needed * rules.scale_down_window_s <= expected_remaining(samples, age):
            break
        kept += 1
    return kept


def _chance_above(expected: Forecast, qps: float) -> float:
    """The chance that the load at the horizon is above `qps`."""
    if expected.spread <= 0:
        return 1.0 if expected.qps > qps else 0.0
    return 0.5 * math.erfc((qps - expected.qps) / (expected.spread * math.sqrt(2)))


def _starting_ages(seen: PoolObservation, signals: PoolSignals) -> tuple[float, ...]:
    """The starting pods' ages; pods the signals do not cover count as just created."""
    ages = tuple(sorted(signals.starting_age_s, reverse=True))[:seen.starting]
    return ages + (0.0,) * (seen.starting - len(ages))


def _describe(rules: ScalingRules, predictive: PredictiveRules, seen: PoolObservation, signals: PoolSignals,
              expected: Forecast, planned: float, replicas: int) -> str:
    learned = (f"median start-up of {len(signals.startup_s)} pods" if signals.startup_s
               else "default start-up, no pod seen ready yet")
    parts = [f"{seen.qps:.1f} QPS now, forecast {expected.qps:.1f} in {expected.horizon_s:.0f}s "
             f"({learned}; trend {expected.trend:+.2f} QPS/s)"]
    if signals.waiting is not None and predictive.queue_per_replica is not None:
        parts.append(f"{signals.waiting} requests waiting (guard above {predictive.queue_per_replica:g} "
                     f"per ready replica)")
    if signals.ttft_p95_s is not None and predictive.ttft_slo_s is not None:
        parts.append(f"TTFT p95 {signals.ttft_p95_s:.2f}s (SLO {predictive.ttft_slo_s:g}s)")
    if signals.unschedulable:
        parts.append(f"{signals.unschedulable} pods wait for a node, so the pool does not grow")
    starting = f", {seen.starting} starting" if seen.starting else ""
    return (", ".join(parts) + f"; plans for {planned:.1f} QPS at {rules.target_qps_per_replica:g} per replica; "
            f"{seen.replicas} requested ({seen.ready_replicas} ready{starting}) -> {replicas}")
