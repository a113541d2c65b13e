"""An EnginePool's status, built from what the cluster shows: its workload (a Deployment, or a
LeaderWorkerSet for a pool over several nodes), its pods, the observed QPS and the last scaling
decision. Conditions say what is true, including that pods cannot be scheduled for lack of GPU
nodes."""

from operators.autoscale_policy import ScalingDecision
from operators.deployment import POOL_LABEL, pod_selector, workload_name

# a pool over several nodes needs LeaderWorkerSet's CRD and controller in the cluster
LWS_MISSING = ("a pool over several nodes (nodesPerReplica above 1) needs the LeaderWorkerSet API "
               "(leaderworkerset.x-k8s.io/v1); if it stays missing, install LeaderWorkerSet's controller in the "
               "cluster, or set nodesPerReplica: 1")


def unschedulable_message(pods: list[dict]) -> str | None:
    """The scheduler's reason for the first pod it could not place (e.g. "0/3 nodes are
    available: 3 Insufficient nvidia.com/gpu."), or None when every pod found a node."""
    return next(filter(None, map(unschedulable_reason, pods)), None)


def unschedulable_reason(pod: dict) -> str | None:
    """Why the scheduler could not place this pod, or None when it could (or has not tried)."""
    for condition in pod.get("status", {}).get("conditions", []):
        if (condition.get("type") == "PodScheduled" and condition.get("status") == "False"
                and condition.get("reason") == "Unschedulable"):
            return condition.get("message") or "no node fits the pod"
    return None


def pool_pods(pool_name: str, pods: list[dict]) -> list[dict]:
    # the API filters by label selector already; filtering again costs nothing and keeps
    # the status right on servers that do not
    return [p for p in pods if p.get("metadata", {}).get("labels", {}).get(POOL_LABEL) == pool_name
            and not p.get("metadata", {}).get("deletionTimestamp")]


def build_status(pool_name: str, kind: str, workload: dict | None, pods: list[dict], qps: float | None,
                 decision: ScalingDecision | None, previous: list[dict], now_iso: str) -> dict:
    """`workload`: the pool's, of `kind` (Deployment or LeaderWorkerSet, operators/workload.py)."""
    pods = pool_pods(pool_name, pods)
    wanted = (workload or {}).get("spec", {}).get("replicas", 0) or 0
    seen = (workload or {}).get("status", {})
    ready = seen.get("readyReplicas", 0) or 0
    stuck = unschedulable_message(pods)

    if workload is None:
        missing = f"{kind} {workload_name(pool_name)} does not exist yet"
        ready_condition = ("False", f"{kind}Missing", missing if kind == "Deployment" else f"{missing}: {LWS_MISSING}")
    elif stuck:
        ready_condition = ("False", "Unschedulable", f"{ready} of {wanted} replicas ready; pods wait for a node: {stuck}")
    elif wanted == 0:
        ready_condition = ("False", "ScaledToZero", "no replicas requested")
    elif ready >= wanted:
        ready_condition = ("True", "AllReplicasReady", f"{ready} of {wanted} replicas ready")
    else:
        ready_condition = ("False", "ReplicasStarting", f"{ready} of {wanted} replicas ready")
    conditions = {
        "Ready": ready_condition,
        "Schedulable": ("False", "Unschedulable", stuck) if stuck else ("True", "PodsScheduled", "every pod has a node"),
    }
    if decision is not None:
        conditions["ScalingActive"] = ("False" if decision.lacks_data else "True", decision.reason, decision.message)

    forecast = decision is not None and decision.forecast_qps is not None
    # every field, None for what is unknown now: the status is merge-patched, and a missing key
    # would keep showing an old value in `kubectl get enginepools`
    return {
        "replicas": seen.get("replicas", 0) or 0,
        "readyReplicas": ready,
        "selector": pod_selector(pool_name),
        **workload_fields(pool_name, kind),
        "conditions": _conditions(conditions, previous, now_iso),
        "desiredReplicas": None if decision is None else decision.replicas,
        "observedQPS": None if qps is None else round(qps, 2),
        "forecastQPS": round(decision.forecast_qps, 2) if forecast else None,
        "forecastHorizonSeconds": round(decision.forecast_horizon_s) if forecast else None,
    }


def foreign_workload_status(pool_name: str, kind: str, previous: list[dict], now_iso: str) -> dict:
    """A workload of the pool's name exists that the pool does not own: the operator leaves it
    alone, so the pool has no replicas and does not scale."""
    message = (f"{kind} {workload_name(pool_name)} exists and is not owned by this EnginePool; it is left "
               f"untouched: delete or rename it to let the pool create its own")
    conditions = {"Ready": ("False", f"Foreign{kind}", message),
                  "Schedulable": ("Unknown", f"Foreign{kind}", message),
                  "ScalingActive": ("False", f"Foreign{kind}", message)}
    return {"replicas": 0, "readyReplicas": 0, "selector": pod_selector(pool_name), "deployment": None,
            "leaderWorkerSet": None, "conditions": _conditions(conditions, previous, now_iso), "desiredReplicas": None,
            "observedQPS": None, "forecastQPS": None, "forecastHorizonSeconds": None}


def workload_fields(pool_name: str, kind: str) -> dict:
    """The name of the pool's workload under its kind; the other kind's null (a merge patch keeps
    what is not written)."""
    name = workload_name(pool_name)
    return {"deployment": name if kind == "Deployment" else None,
            "leaderWorkerSet": name if kind == "LeaderWorkerSet" else None}


def _conditions(current: dict[str, tuple[str, str, str]], previous: list[dict], now_iso: str) -> list[dict]:
    """Conditions keep their lastTransitionTime while their status stays the same."""
    before = {c.get("type"): c for c in previous or []}
    result = []
    for kind, (status, reason, message) in current.items():
        old = before.get(kind, {})
        since = old.get("lastTransitionTime") if old.get("status") == status and old.get("lastTransitionTime") else now_iso
        result.append({"type": kind, "status": status, "reason": reason, "message": message,
                       "lastTransitionTime": since})
    kept = [c for kind, c in before.items() if kind not in current]  # e.g. ScalingActive between decisions
    return result + kept
