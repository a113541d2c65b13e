"""One pool's engines roll at a time. When the operator's own upgrade (a new engine image or new
engine arguments) changes every pool's pod template at once, patching every Deployment at once
would restart every engine of the release together; instead a pool whose template changes waits
while another pool of the release is still rolling out. A scale is never held back.

A workload (a Deployment, or a LeaderWorkerSet for a pool over several nodes) carries the hash
of the templates the operator wrote (TEMPLATE_HASH), which tells a change from the API server's
defaults in the stored templates."""

import hashlib
import json

TEMPLATE_HASH = "k25.io/template-hash"
# the status field counting replicas that serve from the latest template, by the workload's kind
# (operators/workload.py): a LeaderWorkerSet's group is ready when all its pods are
AVAILABLE_FIELD = {"Deployment": "availableReplicas", "LeaderWorkerSet": "readyReplicas"}


def template_hash(template: dict) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:16]


def still_rolling(deployment: dict) -> bool:  # a Deployment or a LeaderWorkerSet
    """As `kubectl rollout status` judges: the controller has not seen the latest spec yet, or not
    every replica runs the latest template and is available. A Deployment without status (none
    written yet) is not taken as rolling."""
    spec, status = deployment.get("spec", {}), deployment.get("status")
    if not status:
        return False
    generation = deployment.get("metadata", {}).get("generation")
    if generation is not None and status.get("observedGeneration", generation) < generation:
        return True
    wanted = spec.get("replicas", 1)
    available = status.get(AVAILABLE_FIELD[deployment.get("kind", "Deployment")]) or 0
    return (status.get("updatedReplicas") or 0) < wanted or available < wanted \
        or (status.get("replicas") or 0) > wanted


def rolling_elsewhere(deployments: list[dict], own_name: str) -> str | None:
    """The name of another workload among these that is still rolling out, or None."""
    for deployment in sorted(deployments, key=lambda d: d["metadata"]["name"]):
        if deployment["metadata"]["name"] != own_name and still_rolling(deployment):
            return deployment["metadata"]["name"]
    return None
