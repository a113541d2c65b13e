"""The operator changes and deletes only the Deployments its pools own: one of the pool's
name that it does not own is left untouched, and the pool says so. Against kmock's
Kubernetes emulator and a real Redis."""

import logging

import kmock
import kopf
import kubernetes
import pytest

from operators.config import FINALIZER, RELEASE_LABEL
from operators.runtime import operator_settings
from tests.helpers.operator_harness import (  # noqa: F401  (fixtures)
    DEPLOYMENTS,
    H100,
    NS,
    POOLS,
    RELEASE,
    RecordingKube,
    cluster,
    condition,
    create_pool,
    operator_config,
    running_operator,
    set_qps,
    stored,
    wait_for,
)
from tests.helpers.redis_server import redis_server  # noqa: F401  (fixture)

pytestmark = [pytest.mark.asyncio, pytest.mark.kmock(cls=kmock.KubernetesEmulator)]


def foreign_deployment(owner_references: list[dict]) -> dict:
    """Someone else's Deployment that happens to have the pool's engine Deployment's name."""
    labels = {"app": "someone-elses"}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "h100-engine", "namespace": NS, "labels": labels, "ownerReferences": owner_references},
            "spec": {"replicas": 3, "selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels}, "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}}


async def put_foreign_deployment(cluster, owner_references: list[dict]) -> dict:
    response = await cluster.post(f"/apis/apps/v1/namespaces/{NS}/deployments",
                                  json=foreign_deployment(owner_references))
    assert response.status == 200
    return stored(cluster, DEPLOYMENTS, "h100-engine")


@pytest.fixture
def kube(cluster):
    return RecordingKube(kubernetes.client.Configuration(host=str(cluster.url).rstrip("/")))


OWNERS = {
    "no owner": [],
    # an earlier pool of the same name, which the garbage collector has not caught up with
    "an earlier pool's": [{"apiVersion": "k25.io/v1alpha1", "kind": "EnginePool", "name": "h100", "uid": "uid-old",
                           "controller": True, "blockOwnerDeletion": True}],
}


@pytest.mark.parametrize("owners", OWNERS.values(), ids=OWNERS.keys())
async def test_a_foreign_deployment_is_left_untouched_and_the_pool_says_so(cluster, redis_server, kube, owners):
    before = await put_foreign_deployment(cluster, owners)
    config = operator_config(redis_server)
    set_qps(redis_server, config, "h100", 800)  # the load would want ten replicas
    async with running_operator(cluster, config, kube=kube):
        await create_pool(cluster, "h100", H100)
        ready = await wait_for(lambda: condition(cluster, "h100", "Ready").get("reason") == "ForeignDeployment"
                               and condition(cluster, "h100", "Ready"), "the pool reports the foreign Deployment")
        reads = kube.reads
        await wait_for(lambda: kube.reads >= reads + 10, "the operator looks at it again and again")
        assert ready["status"] == "False" and "h100-engine" in ready["message"]
        status = stored(cluster, POOLS, "h100")["status"]
        # what `kubectl get enginepools` shows: no replicas, the reason, and no QPS nor forecast of a pool that serves none
        assert (status["replicas"], status["readyReplicas"]) == (0, 0)
        assert not {"observedQPS", "forecastQPS", "desiredReplicas", "deployment"} & set(status)
        assert condition(cluster, "h100", "ScalingActive")["reason"] == "ForeignDeployment"

        response = await cluster.delete(f"/apis/k25.io/v1alpha1/namespaces/{NS}/enginepools/h100")
        assert response.status == 200
        await wait_for(lambda: stored(cluster, POOLS, "h100") is None, "the pool goes once the operator let it")
    assert kube.writes == []
    assert stored(cluster, DEPLOYMENTS, "h100-engine") == before


async def test_once_the_foreign_deployment_has_gone_the_pool_makes_its_own(cluster, redis_server, kube):
    await put_foreign_deployment(cluster, [])
    async with running_operator(cluster, operator_config(redis_server, foreign_recheck_s=0.2), kube=kube):
        await create_pool(cluster, "h100", H100)
        await wait_for(lambda: condition(cluster, "h100", "Ready").get("reason") == "ForeignDeployment",
                       "the pool reports the foreign Deployment")
        response = await cluster.delete(f"/apis/apps/v1/namespaces/{NS}/deployments/h100-engine")
        assert response.status == 200
        ours = await wait_for(lambda: (stored(cluster, DEPLOYMENTS, "h100-engine") or {}).get("metadata", {})
                              .get("ownerReferences"), "the pool's own Deployment appears")
        assert [ref["uid"] for ref in ours] == ["uid-h100"]
        await wait_for(lambda: condition(cluster, "h100", "Ready").get("reason") == "ReplicasStarting",
                       "the pool reports its own replicas")


async def put_handled_pool(cluster, name: str, spec: dict) -> None:
    """A pool as an operator that has since stopped left it: labelled, handled and finalized."""
    body = kopf.Body({"apiVersion": "k25.io/v1alpha1", "kind": "EnginePool", "spec": spec, "metadata": {
        "name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": "1",
        "labels": {RELEASE_LABEL: RELEASE}, "finalizers": [FINALIZER]}})
    storage, patch = operator_settings().persistence.diffbase_storage, kopf.Patch()
    storage.store(body=body, patch=patch, essence=storage.build(body=body))
    response = await cluster.post(f"/apis/k25.io/v1alpha1/namespaces/{NS}/enginepools",
                                  json={**body, "metadata": {**body["metadata"], **patch["metadata"]}})
    assert response.status == 200


async def test_a_deployment_replaced_while_the_operator_was_away_is_neither_scaled_nor_deleted(
        cluster, redis_server, kube, caplog):
    before = await put_foreign_deployment(cluster, [])
    await put_handled_pool(cluster, "h100", H100)
    config = operator_config(redis_server)
    set_qps(redis_server, config, "h100", 800)
    async with running_operator(cluster, config, kube=kube):
        await wait_for(lambda: condition(cluster, "h100", "Ready").get("reason") == "ForeignDeployment",
                       "the pool reports the foreign Deployment")
        with caplog.at_level(logging.WARNING):
            await cluster.patch(f"/apis/k25.io/v1alpha1/namespaces/{NS}/enginepools/h100/scale",
                                json={"spec": {"replicas": 5}})
            await wait_for(lambda: "not scaled: Deployment h100-engine is not owned by this pool" in caplog.text,
                           "kubectl scale leaves it alone")
        await cluster.delete(f"/apis/k25.io/v1alpha1/namespaces/{NS}/enginepools/h100")
        await wait_for(lambda: stored(cluster, POOLS, "h100") is None, "the pool goes once the operator let it")
    assert kube.writes == []
    assert stored(cluster, DEPLOYMENTS, "h100-engine") == before
