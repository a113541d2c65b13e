"""An AdapterRollout's status as Kubernetes stores it, to and from the policy's
RolloutStatus. Conditions: `Progressing` (True while the rollout runs; its reason is what
the last step did) and `CanaryLoaded` (whether every engine of the pool reports the canary
version loaded, naming those that do not)."""

import datetime

from common.rollout_keys import PROGRESSING, PROMOTED, ROLLED_BACK
from operators.pool_status import _conditions as merge_conditions
from operators.rollout_policy import Analysis, Readiness, RolloutStatus

INVALID = "Invalid"  # a phase of the resource only: its spec cannot be rolled out
CONFLICT = "Conflict"  # a phase of the resource only: another AdapterRollout has its adapter


def iso(epoch_s: float) -> str:
    return datetime.datetime.fromtimestamp(epoch_s, datetime.UTC).isoformat(timespec="milliseconds")


def status_to_dict(status: RolloutStatus, pool: str, canary: str, canary_readiness: Readiness,
                   previous_conditions: list[dict], now: float) -> dict:
    """`canary` is "name@version", `canary_readiness` its engines of `pool`."""
    if not canary_readiness.engines:
        loaded = ("False", "NoEngines", f"no live engine in pool {pool}")
    elif canary_readiness.missing:
        loaded = ("False", "EnginesNotReady", f"{canary} not loaded on {', '.join(canary_readiness.missing)}")
    else:
        loaded = ("True", "AllEnginesLoaded", f"every engine of pool {pool} reports {canary} loaded")
    conditions = {"Progressing": ("True" if status.phase == PROGRESSING else "False", status.reason, status.message),
                  "CanaryLoaded": loaded}
    analysis = status.last_analysis
    return {
        "phase": status.phase, "weight": status.weight, "step": status.step, "failures": status.failures,
        "stable": status.stable, "canary": status.canary, "windowStart": iso(status.window_start),
        "reason": status.reason, "message": status.message,
        # explicit nulls: the status is merge-patched, and a missing key would keep the old value
        "lastAnalysis": None if analysis is None else {
            "requests": analysis.requests,
            "errorRate": None if analysis.error_rate is None else round(analysis.error_rate, 6),
            # an infinite p95 (above the last finite bucket) has no JSON number; the message says it
            "p95LatencyMs": (None if analysis.p95_latency_s in (None, float("inf"))
                             else round(analysis.p95_latency_s * 1000, 3)),
            "at": iso(analysis.at)},
        "conditions": merge_conditions(conditions, previous_conditions, iso(now)),
    }


def status_from_dict(raw: dict) -> RolloutStatus | None:
    """The policy's view of a stored status; None for none (a new rollout) or one that is
    not the operator's (the rollout then starts over)."""
    if raw.get("phase") not in (PROGRESSING, PROMOTED, ROLLED_BACK):
        return None
    try:
        analysis = raw.get("lastAnalysis")
        return RolloutStatus(
            stable=str(raw["stable"]), canary=str(raw["canary"]), phase=raw["phase"], step=int(raw["step"]),
            weight=int(raw["weight"]), failures=int(raw["failures"]), window_start=_epoch(raw["windowStart"]),
            reason=str(raw.get("reason", "")), message=str(raw.get("message", "")),
            last_analysis=None if not analysis else Analysis(
                requests=int(analysis["requests"]), error_rate=analysis.get("errorRate"),
                p95_latency_s=None if analysis.get("p95LatencyMs") is None else analysis["p95LatencyMs"] / 1000,
                at=_epoch(analysis["at"])))
    except (KeyError, TypeError, ValueError):
        return None


def invalid_spec_status(message: str, previous_conditions: list[dict], now: float) -> dict:
    return {"phase": INVALID, "reason": "InvalidSpec", "message": message,
            "conditions": merge_conditions({"Progressing": ("False", "InvalidSpec", message)},
                                           previous_conditions, iso(now))}


def conflict_status(owner: str, previous_conditions: list[dict], now: float) -> dict:
    message = (f"its adapter is rolled out by AdapterRollout {owner.rsplit('/', 1)[0]}; this one writes nothing "
               "until that one is deleted")
    return {"phase": CONFLICT, "reason": "AdapterTaken", "message": message,
            "conditions": merge_conditions({"Progressing": ("False", "AdapterTaken", message)},
                                           previous_conditions, iso(now))}


def redis_unavailable_status(error: str, previous_conditions: list[dict], now: float) -> dict:
    message = f"cannot reach Redis ({error}); holding where the rollout is"
    return {"message": message,
            "conditions": merge_conditions({"Progressing": ("Unknown", "RedisUnavailable", message)},
                                           previous_conditions, iso(now))}


def _epoch(text: str) -> float:
    return datetime.datetime.fromisoformat(text).timestamp()
