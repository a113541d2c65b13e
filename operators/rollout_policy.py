"""One step of an adapter canary, as a pure function of what the operator sees.

A rollout starts at the first step's weight. Once a full `interval` has passed since the
current analysis window opened, a check looks at the canary's traffic over that interval:

- fewer than `minRequestsPerStep` requests: hold (the window slides on; no verdict);
- error rate or p95 latency over its limit: a failed check; the window starts over, and
  when the failed checks of this rollout reach `failureThreshold` it rolls back: weight 0,
  the canary removed from the Redis state so that engines unload it;
- within the limits but some engine of the pool has not reported the canary loaded: hold
  (the window starts over, so the next check sees traffic with every engine ready);
- loaded on no engine of the pool at all (it cannot load: a bad checksum, missing files):
  a failed check, checked first, since such a canary gets no traffic to judge;
- within the limits: the next step, or at the last step (100%) promotion: the canary
  becomes the stable version and the old one is unloaded.

Failed checks add up over the whole rollout, not only in a row, so a canary that fails
every other check is still rolled back. A status that belongs to other versions (the spec
was edited) starts the rollout over.
"""

import dataclasses
import math
from dataclasses import dataclass

from common.adapter_stats import LATENCY_BUCKETS, VersionStats
from common.rollout_keys import PROGRESSING, PROMOTED, ROLLED_BACK, RolloutState, versioned_name
from operators.rollout_spec import AdapterVersion, RolloutSpec

# what the last step did (status.reason)
STARTED, WAITING, LOW_TRAFFIC, CHECK_FAILED, ENGINES_NOT_READY, ADVANCED, RESUMED = (
    "Started", "Waiting", "LowTraffic", "CheckFailed", "EnginesNotReady", "Advanced", "Resumed")


@dataclass(frozen=True)
class Analysis:
    requests: int
    error_rate: float | None
    p95_latency_s: float | None
    at: float  # epoch seconds


@dataclass(frozen=True)
class RolloutStatus:
    stable: str  # the versions this status is about
    canary: str
    phase: str  # PROGRESSING, PROMOTED or ROLLED_BACK
    step: int  # index into spec.steps
    weight: int  # percent of users on the canary
    failures: int  # failed checks so far
    window_start: float  # epoch seconds: the next check looks at traffic from here on
    reason: str
    message: str
    last_analysis: Analysis | None = None


@dataclass(frozen=True)
class StepResult:
    status: RolloutStatus
    state: RolloutState  # what the Redis rollout hash must hold


@dataclass(frozen=True)
class Readiness:
    engines: int  # live engines in the pool
    missing: tuple[str, ...]  # the ids of those that do not report the version loaded

    @property
    def ready(self) -> bool:
        return self.engines > 0 and not self.missing


def readiness(engines: dict[str, dict], pool: str, adapter: str, version: str) -> Readiness:
    """Whether every live engine of `pool` (registry entries by engine id) reports `adapter@version`."""
    wanted = versioned_name(adapter, version)
    in_pool = {engine_id: entry for engine_id, entry in engines.items() if entry.get("pool") == pool}
    return Readiness(len(in_pool), tuple(sorted(engine_id for engine_id, entry in in_pool.items()
                                                if wanted not in (entry.get("adapters") or []))))


def decide_step(spec: RolloutSpec, status: RolloutStatus | None, canary: VersionStats,
                canary_loaded: bool, now: float, loaded_nowhere: bool = False,
                stable: VersionStats | None = None) -> StepResult:
    if status is None or not _belongs(spec, status):
        weight = spec.steps[0]
        return _progressing(spec, RolloutStatus(
            stable=spec.stable.version, canary=spec.canary.version, phase=PROGRESSING, step=0, weight=weight,
            failures=0, window_start=now, reason=STARTED,
            message=f"{weight}% of users on {spec.canary.version}"))
    if status.phase == PROMOTED:
        return StepResult(status, _finished(spec.canary, phase=PROMOTED))
    if status.phase == ROLLED_BACK:
        return StepResult(status, _finished(spec.stable, phase=ROLLED_BACK))
    if now - status.window_start < spec.interval_s:
        return _progressing(spec, status)

    analysis = Analysis(canary.requests, canary.error_rate, canary.p95_latency_s, at=now)
    held = dataclasses.replace(status, last_analysis=analysis)
    if loaded_nowhere:  # it cannot load (a bad checksum, missing files): it gets no traffic to judge
        return _failed_check(spec, held, f"{versioned_name(spec.adapter, spec.canary.version)} is loaded on no "
                                          f"engine of pool {spec.pool}", reason=ENGINES_NOT_READY)
    if canary.requests < spec.min_requests_per_step:
        return _progressing(spec, dataclasses.replace(
            held, reason=LOW_TRAFFIC, message=f"holding at {status.weight}%: {canary.requests} canary requests in "
                                              f"the last {spec.interval_s} s, {spec.min_requests_per_step} needed"))
    breaches = _breaches(spec, canary, stable)
    if breaches:
        return _failed_check(spec, held, breaches, reason=CHECK_FAILED)
    if not canary_loaded:
        return _progressing(spec, dataclasses.replace(
            held, window_start=now, reason=ENGINES_NOT_READY,
            message=f"holding at {status.weight}%: not every engine of pool {spec.pool} reports "
                    f"{versioned_name(spec.adapter, spec.canary.version)} loaded"))
    if status.step == len(spec.steps) - 1:
        return StepResult(
            dataclasses.replace(held, phase=PROMOTED, reason=PROMOTED,
                                message=f"{spec.canary.version} promoted to stable, {spec.stable.version} unloaded"),
            _finished(spec.canary, phase=PROMOTED))
    step = status.step + 1
    return _progressing(spec, dataclasses.replace(
        held, step=step, weight=spec.steps[step], window_start=now, reason=ADVANCED,
        message=f"{spec.steps[step]}% of users on {spec.canary.version}"))


def _failed_check(spec: RolloutSpec, held: RolloutStatus, why: str, reason: str) -> StepResult:
    """One more failed check: roll back at the threshold, else hold with a new window."""
    failures = held.failures + 1
    if failures >= spec.failure_threshold:
        return StepResult(
            dataclasses.replace(held, phase=ROLLED_BACK, weight=0, failures=failures, reason=ROLLED_BACK,
                                message=f"rolled back to {spec.stable.version} after {failures} failed checks; last: {why}"),
            _finished(spec.stable, phase=ROLLED_BACK))
    return _progressing(spec, dataclasses.replace(
        held, failures=failures, window_start=held.last_analysis.at, reason=reason,
        message=f"holding at {held.weight}%: check failed ({failures} of {spec.failure_threshold}): {why}"))


def recovered_status(spec: RolloutSpec, stored: RolloutState | None, now: float) -> RolloutStatus | None:
    """The status to go on from when a rollout has none of its own (its status was lost: a
    restore, a re-created resource) but the adapter's Redis state is one this spec writes: a
    promotion stays promoted, a canary keeps its step. None: start over (so does a rollback,
    whose state does not say which canary it rolled back)."""
    if stored is None:
        return None
    stored = dataclasses.replace(stored, generation=0)
    common = dict(stable=spec.stable.version, canary=spec.canary.version, failures=0, window_start=now,
                  message="resumed from the adapter's rollout state (this rollout's status was lost)")
    if stored == _finished(spec.canary, phase=PROMOTED):
        return RolloutStatus(phase=PROMOTED, step=len(spec.steps) - 1, weight=100, reason=PROMOTED, **common)
    for step, weight in enumerate(spec.steps):
        status = RolloutStatus(phase=PROGRESSING, step=step, weight=weight, reason=RESUMED, **common)
        if stored == _progressing(spec, status).state:
            return status
    return None


def _belongs(spec: RolloutSpec, status: RolloutStatus) -> bool:
    if (status.stable, status.canary) != (spec.stable.version, spec.canary.version):
        return False
    if status.phase == PROMOTED:
        return status.weight == 100
    if status.phase == ROLLED_BACK:
        return status.weight == 0
    return status.phase == PROGRESSING and 0 <= status.step < len(spec.steps) and spec.steps[status.step] == status.weight


def _breaches(spec: RolloutSpec, canary: VersionStats, stable: VersionStats | None) -> str:
    """What the canary's traffic breaks: its error rate above max_error_rate, or above stable's by
    more than that; its p95 above max_p95_latency_s, or above stable's times max_p95_latency_ratio
    (stable over the same interval, counted when it had min_requests_per_step requests)."""
    found = []
    compared = stable if stable is not None and stable.requests >= spec.min_requests_per_step else None
    stable_errors = (compared.error_rate or 0.0) if compared else 0.0
    allowed_errors = spec.max_error_rate + stable_errors
    if canary.error_rate is not None and canary.error_rate > allowed_errors:
        against = f" (stable's {compared.error_rate:.2%} + {spec.max_error_rate:.2%})" if compared else ""
        found.append(f"error rate {canary.error_rate:.2%} > {allowed_errors:.2%}{against}")
    if canary.p95_latency_s is not None:
        if canary.p95_latency_s > spec.max_p95_latency_s:
            found.append(f"p95 latency {_ms(canary.p95_latency_s)} > {spec.max_p95_latency_s * 1000:g} ms")
        elif compared and compared.p95_latency_s and canary.p95_latency_s > compared.p95_latency_s * spec.max_p95_latency_ratio:
            found.append(f"p95 latency {_ms(canary.p95_latency_s)} > {spec.max_p95_latency_ratio:g}x stable's "
                         f"{_ms(compared.p95_latency_s)}")
    return "; ".join(found)


def _ms(latency_s: float) -> str:
    return f"above {LATENCY_BUCKETS[-2][1] * 1000:g} ms" if math.isinf(latency_s) else f"{latency_s * 1000:g} ms"


def _progressing(spec: RolloutSpec, status: RolloutStatus) -> StepResult:
    return StepResult(status, RolloutState(
        stable_version=spec.stable.version, stable_source=spec.stable.source, stable_sha256=spec.stable.sha256,
        canary_version=spec.canary.version, canary_source=spec.canary.source, canary_sha256=spec.canary.sha256,
        canary_weight=status.weight, allow_list=spec.allow_list, phase=PROGRESSING))


def _finished(stable: AdapterVersion, phase: str) -> RolloutState:
    """A finished rollout: one version, no canary, so engines unload the other."""
    return RolloutState(stable_version=stable.version, stable_source=stable.source, stable_sha256=stable.sha256,
                        phase=phase)
