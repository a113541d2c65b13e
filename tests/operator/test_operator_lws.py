"""The operator with a vLLM pool over several nodes, against kmock's Kubernetes emulator and a real
Redis: the pool's engines are a LeaderWorkerSet (one group of pods an engine) that the operator
creates, scales by groups through its scale subresource, replaces by a Deployment and back when
nodesPerReplica crosses 1, and deletes with the pool. kmock runs no LeaderWorkerSet controller:
a stand-in reports the groups ready where a test needs it."""

import asyncio
import contextlib

import kmock
import pytest

from tests.helpers.operator_harness import (  # noqa: F401  (fixtures)
    DEPLOYMENTS,
    H100,
    LEADER_WORKER_SETS,
    NS,
    POOLS,
    cluster,
    condition,
    create_pool,
    operator,
    operator_config,
    running_operator,
    set_qps,
    stored,
    wait_for,
)
from tests.helpers.redis_server import redis_server  # noqa: F401  (fixture)

pytestmark = [pytest.mark.asyncio, pytest.mark.kmock(cls=kmock.KubernetesEmulator)]

TWO_NODES = {**H100, "backend": "vllm", "gpusPerReplica": 4, "nodesPerReplica": 2}
LWS_PATH = f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{NS}/leaderworkersets"


def groups(cluster, pool: str) -> int | None:
    lws = stored(cluster, LEADER_WORKER_SETS, f"{pool}-engine")
    return None if lws is None else lws["spec"]["replicas"]


@contextlib.asynccontextmanager
async def groups_become_ready(cluster, name: str):
    """Stand-in for LeaderWorkerSet's controller: every requested group is ready at once."""

    async def mark_ready():
        while True:
            found = stored(cluster, LEADER_WORKER_SETS, name)
            if found is not None and found.get("status", {}).get("readyReplicas") != found["spec"]["replicas"]:
                wanted = found["spec"]["replicas"]
                await cluster.patch(f"{LWS_PATH}/{name}/status", json={"status": {
                    "replicas": wanted, "readyReplicas": wanted, "updatedReplicas": wanted}})
            await asyncio.sleep(0.05)

    task = asyncio.create_task(mark_ready())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_pool_over_two_nodes_gets_a_leader_worker_set_scaled_by_groups(cluster, operator, redis_server):
    await create_pool(cluster, "big", TWO_NODES)
    lws = await wait_for(lambda: stored(cluster, LEADER_WORKER_SETS, "big-engine"), "the LeaderWorkerSet appears")
    assert stored(cluster, DEPLOYMENTS, "big-engine") is None
    assert (lws["spec"]["replicas"], lws["spec"]["leaderWorkerTemplate"]["size"]) == (1, 2)
    assert lws["metadata"]["ownerReferences"][0]["uid"] == "uid-big"
    async with groups_become_ready(cluster, "big-engine"):
        set_qps(redis_server, operator, "big", 5 * 79)  # 79 per engine of 5, each engine a group of two nodes
        await wait_for(lambda: groups(cluster, "big") == 5, "the pool scales out by groups")
        status = await wait_for(lambda: stored(cluster, POOLS, "big")["status"].get("readyReplicas") == 5
                                and stored(cluster, POOLS, "big")["status"], "the pool's five groups are ready")
    assert (status["leaderWorkerSet"], status.get("deployment")) == ("big-engine", None)
    assert condition(cluster, "big", "Ready")["reason"] == "AllReplicasReady"
    scales = [r for r in cluster if r.method == "PATCH" and r.resource and r.resource.plural == "leaderworkersets"
              and r.subresource == "scale"]
    assert scales  # the replica count alone, through the scale subresource


async def test_nodes_per_replica_crossing_one_swaps_the_deployment_for_a_leader_worker_set_and_back(cluster, operator):
    await create_pool(cluster, "big", {**TWO_NODES, "nodesPerReplica": 1})
    await wait_for(lambda: stored(cluster, DEPLOYMENTS, "big-engine"), "a Deployment for one node an engine")
    for nodes, now, before in ((2, LEADER_WORKER_SETS, DEPLOYMENTS), (1, DEPLOYMENTS, LEADER_WORKER_SETS)):
        await cluster.patch(f"/apis/k25.io/v1alpha1/namespaces/{NS}/enginepools/big", json={"spec": {"nodesPerReplica": nodes}})

        def replaced(now=now, before=before) -> bool:
            return stored(cluster, now, "big-engine") is not None and stored(cluster, before, "big-engine") is None

        await wait_for(replaced, f"nodesPerReplica {nodes}: the other kind of workload replaces the old one")

    def names_the_deployment_alone() -> bool:
        status = stored(cluster, POOLS, "big").get("status", {})
        return status.get("deployment") == "big-engine" and status.get("leaderWorkerSet") is None

    await wait_for(names_the_deployment_alone, "the status names the Deployment alone")


async def test_deleting_the_pool_deletes_its_leader_worker_set(cluster, operator):
    await create_pool(cluster, "big", TWO_NODES)
    await wait_for(lambda: stored(cluster, LEADER_WORKER_SETS, "big-engine"), "the LeaderWorkerSet appears")
    response = await cluster.delete(f"/apis/k25.io/v1alpha1/namespaces/{NS}/enginepools/big")
    assert response.status == 200
    await wait_for(lambda: stored(cluster, LEADER_WORKER_SETS, "big-engine") is None, "the LeaderWorkerSet goes")
    await wait_for(lambda: stored(cluster, POOLS, "big") is None, "the pool goes once the operator let it")


async def test_without_the_leader_worker_set_api_the_pool_says_what_to_install_and_keeps_its_engines(
        cluster, redis_server):
    # a cluster without LeaderWorkerSet's CRD: its API answers 404 (kmock would store any object otherwise)
    del cluster.resources[LEADER_WORKER_SETS]
    cluster[kmock.resource(LEADER_WORKER_SETS)] << kmock.KubernetesResourceNotFoundError
    async with running_operator(cluster, operator_config(redis_server)):
        await create_pool(cluster, "big", {**TWO_NODES, "nodesPerReplica": 1})
        await wait_for(lambda: stored(cluster, DEPLOYMENTS, "big-engine"), "a Deployment for one node an engine")
        await cluster.patch(f"/apis/k25.io/v1alpha1/namespaces/{NS}/enginepools/big", json={"spec": {"nodesPerReplica": 2}})
        ready = await wait_for(lambda: condition(cluster, "big", "Ready").get("reason") == "LeaderWorkerSetMissing"
                               and condition(cluster, "big", "Ready"), "the pool says what is missing")
        await wait_for(lambda: any(r.method == "POST" and r.resource and r.resource.plural == "leaderworkersets"
                                   for r in cluster), "the operator tried to create it")
        assert stored(cluster, DEPLOYMENTS, "big-engine") is not None  # the engines it had serve on
    assert "needs the LeaderWorkerSet API (leaderworkerset.x-k8s.io/v1); if it stays missing, install" in ready["message"]
