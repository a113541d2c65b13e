"""The workload that runs a pool's engines: a Deployment, one pod an engine, or for a pool over
several nodes (nodesPerReplica above 1) a LeaderWorkerSet, one group of pods an engine. Both are
named {pool}-engine, owned by the pool, counted in engines (spec.replicas) and scaled through their
scale subresource, so the operator handles them alike but for how each is built and read."""

import os
from collections.abc import Mapping
from dataclasses import dataclass

from operators import leader_worker_set
from operators.config import OperatorConfig
from operators.deployment import build_deployment
from operators.pool_spec import EnginePoolSpec


@dataclass(frozen=True)
class WorkloadKind:
    kind: str
    group: str
    version: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


DEPLOYMENT = WorkloadKind("Deployment", "apps", "v1", "deployments")
LEADER_WORKER_SET = WorkloadKind("LeaderWorkerSet", *leader_worker_set.API_VERSION.split("/"), "leaderworkersets")
KINDS = (DEPLOYMENT, LEADER_WORKER_SET)
BY_NAME = {kind.kind: kind for kind in KINDS}


def workload_kind(spec: EnginePoolSpec) -> WorkloadKind:
    return LEADER_WORKER_SET if spec.nodes_per_replica > 1 else DEPLOYMENT


def build_workload(pool: dict, spec: EnginePoolSpec, replicas: int, config: OperatorConfig,
                   operator_env: Mapping[str, str] = os.environ) -> dict:
    build = leader_worker_set.build_leader_worker_set if workload_kind(spec) is LEADER_WORKER_SET else build_deployment
    return build(pool, spec, replicas, config, operator_env)


def workload_patch(manifest: dict, replicas: int) -> dict:
    """What the operator writes over a workload it owns: the manifest's labels, annotations, owner
    and spec, with the replica count it keeps (a Deployment's selector cannot change, so it is left)."""
    metadata = manifest["metadata"]
    return {"metadata": {key: metadata[key] for key in ("labels", "annotations", "ownerReferences")},
            "spec": {**{k: v for k, v in manifest["spec"].items() if k != "selector"}, "replicas": replicas}}
