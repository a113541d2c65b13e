"""The operator against kmock's Kubernetes emulator and a real Redis: the fixtures and
helpers that the operator's end-to-end test modules share.

A module that uses them marks itself `pytest.mark.kmock(cls=kmock.KubernetesEmulator)` and
imports `cluster`, `operator` (and `redis_server`, which `operator` needs) by name.
"""

import asyncio
import contextlib
import math
import threading
import time

import kopf
import kubernetes
import pytest
import pytest_asyncio
import redis

from common.redis_keys import BUCKET_TTL_S, qps_bucket_key
from operators.config import RELEASE_LABEL, OperatorConfig
from operators.kube import KubeApi
from operators.runtime import build_registry, operator_memo, operator_scope, operator_settings, peering_name

NS = "serving"
RELEASE = "test"  # the `operator` fixture's release: the label its resources need
POOLS = "k25.io/v1alpha1/enginepools"
DEPLOYMENTS = "apps/v1/deployments"
LEADER_WORKER_SETS = "leaderworkerset.x-k8s.io/v1/leaderworkersets"
ROLLOUTS = "k25.io/v1alpha1/adapterrollouts"
CLUSTER_PEERINGS = "kopf.dev/v1/clusterkopfpeerings"
PEERINGS = "kopf.dev/v1/kopfpeerings"
WAIT_S = 20.0  # generous: the assertions are about what happens, not how fast
H100 = {"nodeType": "H100-80G", "model": "/models/smollm2", "chunkSize": 512, "gpusPerReplica": 1,
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, "minReplicas": 1, "maxReplicas": 10}


@pytest.fixture
def cluster(kmock):
    info = kmock.ResourceInfo
    kmock.resources[POOLS] = info(kind="EnginePool", namespaced=True, subresources={"status", "scale"},
                                  verbs={"list", "watch", "get", "patch", "create", "delete"})
    kmock.resources[DEPLOYMENTS] = info(kind="Deployment", namespaced=True, subresources={"status", "scale"})
    kmock.resources[LEADER_WORKER_SETS] = info(kind="LeaderWorkerSet", namespaced=True, subresources={"status", "scale"})
    kmock.resources[ROLLOUTS] = info(kind="AdapterRollout", namespaced=True, subresources={"status"},
                                     verbs={"list", "watch", "get", "patch", "create", "delete"})
    kmock.resources["v1/pods"] = info(kind="Pod", namespaced=True)
    kmock.resources["v1/namespaces"] = info(kind="Namespace", namespaced=False)  # kopf waits to discover it
    kmock.resources[CLUSTER_PEERINGS] = info(kind="ClusterKopfPeering", namespaced=False,
                                             verbs={"list", "watch", "get", "patch", "create"})
    kmock.resources[PEERINGS] = info(kind="KopfPeering", namespaced=True,
                                     verbs={"list", "watch", "get", "patch", "create"})
    return kmock


class RecordingKube(KubeApi):
    """Counts the operator's reads of workloads and records its writes: (verb, kind, name)."""

    def __init__(self, configuration):
        super().__init__(configuration)
        self.reads, self.writes = 0, []

    def get_workload(self, kind, namespace, name):
        self.reads += 1
        return super().get_workload(kind, namespace, name)

    def create_workload(self, kind, namespace, body):
        self.writes.append(("create", kind.kind, body["metadata"]["name"]))
        return super().create_workload(kind, namespace, body)

    def patch_workload(self, kind, namespace, name, patch):
        self.writes.append(("patch", kind.kind, name))
        return super().patch_workload(kind, namespace, name, patch)

    def scale_workload(self, kind, namespace, name, replicas):
        self.writes.append(("scale", kind.kind, name))
        return super().scale_workload(kind, namespace, name, replicas)

    def delete_workload(self, kind, namespace, name):
        self.writes.append(("delete", kind.kind, name))
        return super().delete_workload(kind, namespace, name)


@contextlib.asynccontextmanager
async def running_operator(cluster, config: OperatorConfig, namespaces: tuple[str, ...] = (),
                           priority: int | None = None, kube: KubeApi | None = None):
    """The operator in its own thread and event loop, as in production: kopf cancels the
    tasks that its loop started, which must not be the test's. Without a priority it runs
    standalone; with one, it takes part in its release's peering (whose record must exist)."""
    registry = build_registry(config)
    url = str(cluster.url).rstrip("/")

    @kopf.on.login(registry=registry)
    def login(**_):
        return kopf.ConnectionInfo(server=url)

    settings = operator_settings(namespaced=bool(namespaces))
    settings.posting.enabled = False
    stop = threading.Event()
    kube = kube or KubeApi(kubernetes.client.Configuration(host=url))
    scope = operator_scope(config, list(namespaces), priority, standalone=priority is None)
    thread = threading.Thread(target=asyncio.run, args=(kopf.operator(
        registry=registry, settings=settings, memo=operator_memo(config, kube), stop_flag=stop, **scope),))
    thread.start()
    try:
        yield config
    finally:
        stop.set()
        while thread.is_alive():  # the emulator in this loop must keep answering while kopf stops
            await asyncio.sleep(0.05)
        kube.close()


def operator_config(redis_url: str, release: str = RELEASE, **settings) -> OperatorConfig:
    """Quick decisions over a short QPS window, so that tests see them soon."""
    return OperatorConfig(release=release, redis_url=redis_url, interval_s=0.2, qps_window_s=2, **settings)


@pytest_asyncio.fixture
async def operator(cluster, redis_server):
    async with running_operator(cluster, operator_config(redis_server)) as config:
        yield config


async def create_resource(cluster, plural: str, kind: str, name: str, spec: dict, release: str | None = RELEASE,
                          namespace: str = NS) -> None:
    """A k25.io resource labelled for `release` (None: no label), as the chart or a user makes one."""
    labels = {} if release is None else {RELEASE_LABEL: release}
    body = {"apiVersion": "k25.io/v1alpha1", "kind": kind, "spec": spec, "metadata": {
        "name": name, "namespace": namespace, "uid": f"uid-{name}", "resourceVersion": "1", "labels": labels}}
    response = await cluster.post(f"/apis/k25.io/v1alpha1/namespaces/{namespace}/{plural}", json=body)
    assert response.status == 200


async def create_pool(cluster, name: str, spec: dict, **where) -> None:
    await create_resource(cluster, "enginepools", "EnginePool", name, spec, **where)


def set_qps(redis_url: str, config: OperatorConfig, pool: str, qps: int) -> None:
    """The gateway's buckets for the last minute and the next two: a steady load."""
    client = redis.Redis.from_url(redis_url)
    now = math.floor(time.time())
    pipe = client.pipeline()
    for second in range(now - 60, now + 120):
        pipe.set(qps_bucket_key(config.release, pool, second), qps, ex=BUCKET_TTL_S)
    pipe.execute()
    client.close()


async def wait_for(check, what: str):
    deadline = time.monotonic() + WAIT_S
    while not (result := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"never happened: {what}")
        await asyncio.sleep(0.05)
    return result


def stored(cluster, resource: str, name: str, ns: str | None = NS) -> dict | None:
    try:
        found = cluster.objects[resource, ns, name]
    except KeyError:
        return None
    return None if found.deleted else found.raw


def replicas(cluster, pool: str, ns: str = NS) -> int | None:
    deployment = stored(cluster, DEPLOYMENTS, f"{pool}-engine", ns)
    return None if deployment is None else deployment["spec"]["replicas"]


def condition(cluster, pool: str, kind: str, ns: str = NS) -> dict:
    conditions = (stored(cluster, POOLS, pool, ns) or {}).get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == kind), {})


async def create_peering(cluster, release: str, namespace: str | None = None) -> None:
    """The release's peering record, as the chart makes it: cluster-wide, or in the one namespace watched."""
    kind, path = (("ClusterKopfPeering", "/apis/kopf.dev/v1/clusterkopfpeerings") if namespace is None else
                  ("KopfPeering", f"/apis/kopf.dev/v1/namespaces/{namespace}/kopfpeerings"))
    metadata = {"name": peering_name(release), "resourceVersion": "1"} | ({"namespace": namespace} if namespace else {})
    response = await cluster.post(path, json={"apiVersion": "kopf.dev/v1", "kind": kind, "metadata": metadata})
    assert response.status == 200


def peers(cluster, release: str, namespace: str | None = None) -> int:
    resource = CLUSTER_PEERINGS if namespace is None else PEERINGS
    return len((stored(cluster, resource, peering_name(release), ns=namespace) or {}).get("status", {}))
