"""The Kubernetes HPA v2 algorithm (autoscaling/v2, pkg/controller/podautoscaler) with its
default behaviour, for the simulation only: a baseline that our policy must beat.

Defaults: sync every 15 s; 10% tolerance; scale-up stabilisation 0 s with policies
"100% or 4 pods per 15 s, whichever is more"; scale-down stabilisation 300 s with
"100% per 15 s". The metric is an AverageValue target (QPS per pod) against the pods
that exist (`status.replicas`, starting pods included), as for an External metric.
"""

import math
from dataclasses import dataclass, field

SYNC_PERIOD_S = 15.0


@dataclass
class HorizontalPodAutoscaler:
    min_replicas: int
    max_replicas: int
    target_per_pod: float
    tolerance: float = 0.10
    scale_up_window_s: float = 0.0
    scale_down_window_s: float = 300.0
    scale_up_percent: float = 100.0
    scale_up_pods: int = 4
    policy_period_s: float = 15.0
    period_s: float = SYNC_PERIOD_S
    _recommendations: list[tuple[float, int]] = field(default_factory=list)
    _scale_up_events: list[tuple[float, int]] = field(default_factory=list)
    _scale_down_events: list[tuple[float, int]] = field(default_factory=list)

    def step(self, now: float, qps: float | None, spec_replicas: int, status_replicas: int) -> int:
        """The HPA's new spec.replicas after one sync at `now`."""
        if qps is None:
            return spec_replicas  # FailedGetExternalMetric: no change
        if spec_replicas == 0:
            return 0  # autoscaling is disabled for a Deployment scaled to zero
        proposal = self._replicas_for_metric(qps, spec_replicas, status_replicas)
        desired = self._normalise(now, spec_replicas, proposal)
        if desired > spec_replicas:
            self._scale_up_events.append((now, desired - spec_replicas))
        elif desired < spec_replicas:
            self._scale_down_events.append((now, spec_replicas - desired))
        return desired

    def _replicas_for_metric(self, usage: float, spec_replicas: int, status_replicas: int) -> int:
        # GetExternalPerPodMetricReplicas
        ratio = usage / (self.target_per_pod * status_replicas) if status_replicas else math.inf
        if abs(1.0 - ratio) <= self.tolerance:
            return spec_replicas
        return math.ceil(usage / self.target_per_pod)

    def _normalise(self, now: float, current: int, proposal: int) -> int:
        # normalizeDesiredReplicasWithBehaviors: stabilise, then limit the rate, then clamp
        stabilised = self._stabilise(now, current, proposal)
        return self._limit_rate(now, current, stabilised)

    def _stabilise(self, now: float, current: int, proposal: int) -> int:
        up = down = proposal
        for at, recommendation in self._recommendations:
            if at > now - self.scale_up_window_s:
                up = min(up, recommendation)
            if at > now - self.scale_down_window_s:
                down = max(down, recommendation)
        horizon = now - max(self.scale_up_window_s, self.scale_down_window_s)
        self._recommendations = [r for r in self._recommendations if r[0] > horizon]
        self._recommendations.append((now, proposal))
        return min(max(current, up), down)

    def _limit_rate(self, now: float, current: int, desired: int) -> int:
        if desired > current:
            added = self._change_in_period(now, self._scale_up_events)
            removed = self._change_in_period(now, self._scale_down_events)
            period_start = current - added + removed
            limit = max(math.ceil(period_start * (1 + self.scale_up_percent / 100)),
                        period_start + self.scale_up_pods)
            desired = min(desired, max(limit, current), self.max_replicas)
        elif desired < current:
            # default scale-down policy: 100% per period, i.e. no limit beyond minReplicas
            desired = max(desired, self.min_replicas)
        return min(max(desired, self.min_replicas), self.max_replicas)

    def _change_in_period(self, now: float, events: list[tuple[float, int]]) -> int:
        return sum(change for at, change in events if at > now - self.policy_period_s)
