"""The operator end to end against kmock's Kubernetes emulator and a real Redis.

kmock stores objects and serves the API but runs no controllers, so two small stand-ins
play kube-controller-manager's part where a test needs it: one reports a Deployment's
pods as ready, the other adds pods the scheduler could not place.
"""

import asyncio
import contextlib
import datetime
import math
import time

import kmock
import kubernetes
import pytest
import redis

from common.redis_keys import BUCKET_TTL_S, qps_bucket_key, record_requests, register_engine
from operators.config import OperatorConfig
from tests.helpers.operator_harness import (  # noqa: F401  (fixtures)
    DEPLOYMENTS,
    H100,
    NS,
    POOLS,
    RecordingKube,
    cluster,
    condition,
    create_peering,
    create_pool,
    operator,
    operator_config,
    peers,
    replicas,
    running_operator,
    set_qps,
    stored,
    wait_for,
)
from tests.helpers.redis_server import redis_server  # noqa: F401  (fixture)

pytestmark = [pytest.mark.asyncio, pytest.mark.kmock(cls=kmock.KubernetesEmulator)]


def set_ramp(redis_url: str, config: OperatorConfig, pool: str, start: int, per_second: int, peak: int) -> None:
    """The gateway's buckets for a load that has risen by `per_second` each second for the
    last four minutes and goes on rising, up to `peak`, for the next ten."""
    client = redis.Redis.from_url(redis_url)
    now = math.floor(time.time())
    pipe = client.pipeline()
    for second in range(now - 240, now + 600):
        pipe.set(qps_bucket_key(config.release, pool, second), min(peak, start + per_second * (second - now + 240)),
                 ex=BUCKET_TTL_S)
    pipe.execute()
    client.close()


async def add_ready_pod(cluster, pool: str, name: str, startup_s: int) -> None:
    """A pod of the pool that became ready `startup_s` after its creation."""
    created = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    ready = created + datetime.timedelta(seconds=startup_s)
    await cluster.post(f"/api/v1/namespaces/{NS}/pods", json={
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"k25.io/pool": pool},
                     "creationTimestamp": created.isoformat().replace("+00:00", "Z")},
        "status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": ready.isoformat().replace("+00:00", "Z")}]},
    })


@contextlib.asynccontextmanager
async def in_background(work):
    """`work` (a coroutine that runs until cancelled) runs while the block does."""
    task = asyncio.create_task(work)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def pods_become_ready(cluster, deployment: str):
    """Stand-in for the Deployment controller: every requested pod is ready at once."""

    async def mark_ready():
        while True:
            found = stored(cluster, DEPLOYMENTS, deployment)
            if found is not None:
                wanted = found["spec"]["replicas"]
                if found.get("status", {}).get("readyReplicas") != wanted:
                    await cluster.patch(f"/apis/apps/v1/namespaces/{NS}/deployments/{deployment}/status",
                                        json={"status": {"replicas": wanted, "readyReplicas": wanted}})
            await asyncio.sleep(0.05)

    async with in_background(mark_ready()):
        yield


async def test_a_pool_gets_an_engine_deployment_for_its_gpu_nodes(cluster, operator):
    await create_pool(cluster, "h100", H100)
    deployment = await wait_for(lambda: stored(cluster, DEPLOYMENTS, "h100-engine"), "the Deployment appears")

    assert deployment["spec"]["replicas"] == 1
    assert deployment["metadata"]["ownerReferences"] == [{
        "apiVersion": "k25.io/v1alpha1", "kind": "EnginePool", "name": "h100", "uid": "uid-h100",
        "controller": True, "blockOwnerDeletion": True}]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    engine = pod["containers"][0]
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert engine["args"] == ["k25", "engine", "--model", "/models/smollm2", "--chunk-size", "512",
                              "--max-chunk-per-gpu", "8", "--node-type", "H100-80G", "--pool", "h100",
                              "--zmq-port", "5555", "--metrics-port", "9100", "--release", "test",
                              "--bind-address", "$(POD_IP)", "--advertise-host", "$(POD_IP)", "--device", "cuda",
                              "--drain-timeout-s", "600"]
    # the operator names no Secret here, and its URL carries no password: the engines get it as it is
    assert {"name": "K25_REDIS_URL", "value": operator.redis_url} in engine["env"]


async def test_a_lora_pool_gets_adapter_flags_the_adapter_mount_and_the_operators_otlp_endpoint(
        cluster, operator, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://k25-otel-collector:4318")
    await create_pool(cluster, "legal", {**H100, "lora": {"maxLoras": 4, "claimName": "adapters"}})
    deployment = await wait_for(lambda: stored(cluster, DEPLOYMENTS, "legal-engine"), "the Deployment appears")

    engine = deployment["spec"]["template"]["spec"]["containers"][0]
    assert engine["args"][-10:] == ["--max-loras", "4", "--max-cpu-loras", "8", "--max-lora-rank", "64",
                                    "--lora-kernel", "torch", "--adapter-root", "/adapters"]
    assert {"name": "adapters", "mountPath": "/adapters", "readOnly": True} in engine["volumeMounts"]
    assert {"name": "adapters", "persistentVolumeClaim": {"claimName": "adapters", "readOnly": True}} in \
        deployment["spec"]["template"]["spec"]["volumes"]
    assert {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://k25-otel-collector:4318"} in engine["env"]


async def test_qps_above_80_per_replica_scales_out_and_a_fall_scales_in_after_the_window(
        cluster, operator, redis_server):
    await create_pool(cluster, "h100", {**H100, "scaleDownStabilizationSeconds": 2})
    await create_pool(cluster, "patient", {**H100, "scaleDownStabilizationSeconds": 300})
    async with pods_become_ready(cluster, "h100-engine"), pods_become_ready(cluster, "patient-engine"):
        await wait_for(lambda: replicas(cluster, "h100") == 1 and replicas(cluster, "patient") == 1, "both start")

        for pool in ("h100", "patient"):
            set_qps(redis_server, operator, pool, 5 * 81)  # 81 per replica of 5
        await wait_for(lambda: replicas(cluster, "h100") == 6, "h100 scales out to ceil(405 / 80)")
        await wait_for(lambda: replicas(cluster, "patient") == 6, "patient scales out too")
        await wait_for(lambda: stored(cluster, POOLS, "h100").get("status", {}).get("observedQPS") == 405,
                       "status shows the QPS")

        for pool in ("h100", "patient"):
            set_qps(redis_server, operator, pool, 150)
        await wait_for(lambda: condition(cluster, "h100", "ScalingActive").get("reason") == "ScaleDownStabilising",
                       "the short window holds the size first")
        assert replicas(cluster, "h100") == 6
        await wait_for(lambda: replicas(cluster, "h100") == 2, "h100 scales in once its 2 s window has passed")
        await wait_for(lambda: condition(cluster, "patient", "ScalingActive").get("reason") == "ScaleDownStabilising",
                       "the long window is holding")
        assert replicas(cluster, "patient") == 6
        assert condition(cluster, "h100", "Ready")["status"] == "True"


async def test_a_ramping_pool_gets_its_pods_before_the_load_arrives_and_shows_the_forecast(
        cluster, operator, redis_server):
    """The pool's pods took 240 s to become ready, so it plans for the load 240 s ahead; the
    reactive pool beside it plans for the load now."""
    peak = 1100
    await create_pool(cluster, "ramp", {**H100, "minReplicas": 2, "maxReplicas": 20})
    await create_pool(cluster, "now", {**H100, "minReplicas": 2, "maxReplicas": 20, "autoscalingPolicy": "reactive"})
    for index in range(3):
        await add_ready_pod(cluster, "ramp", f"ramp-engine-old{index}", startup_s=240)
    async with pods_become_ready(cluster, "ramp-engine"), pods_become_ready(cluster, "now-engine"):
        for pool in ("ramp", "now"):
            set_ramp(redis_server, operator, pool, start=300, per_second=1, peak=peak)

        def ahead():
            status = (stored(cluster, POOLS, "ramp") or {}).get("status", {})
            qps, planned = status.get("observedQPS"), status.get("desiredReplicas")
            # learned from its pods (the first decisions may come before the operator saw them),
            # and capacity, at 80 per replica, for at least 200 QPS more than arrive now, before the peak
            return (status.get("forecastHorizonSeconds") == 240 and qps is not None and qps < peak
                    and planned * 80 >= qps + 200 and status)

        status = await wait_for(ahead, "the ramping pool plans pods for the load to come")
        assert status["forecastQPS"] == pytest.approx(status["observedQPS"] + 240, abs=1)  # 1 QPS more each second
        scaling = next(c for c in status["conditions"] if c["type"] == "ScalingActive")
        assert "median start-up of 3 pods" in scaling["message"] and "trend +1.00 QPS/s" in scaling["message"]
        await wait_for(lambda: replicas(cluster, "ramp") >= status["desiredReplicas"], "the Deployment has them")

        def reactive_settled():
            status = (stored(cluster, POOLS, "now") or {}).get("status", {})
            qps = status.get("observedQPS")
            return qps is not None and status.get("desiredReplicas") == math.ceil(qps / 80) and status

        status = await wait_for(reactive_settled, "the reactive pool plans for the load now")
        assert "forecastQPS" not in status


@contextlib.asynccontextmanager
async def gateway_demand(redis_url: str, release: str, pool: str):
    """Requests to the pool arriving all the while, counted as the gateway counts them
    (`record_requests`), also while the pool has no live engine to serve them."""

    async def count():
        client = redis.Redis.from_url(redis_url)
        try:
            while True:
                pipe = client.pipeline()
                record_requests(pipe, release, pool, time.time())
                pipe.execute()
                await asyncio.sleep(0.1)
        finally:
            client.close()

    async with in_background(count()):
        yield


@pytest.mark.parametrize("policy", ["predictive", "reactive"])
async def test_a_pool_at_zero_replicas_is_woken_by_its_own_demand(cluster, operator, redis_server, policy):
    await create_pool(cluster, "idle", {**H100, "minReplicas": 0, "autoscalingPolicy": policy})
    await wait_for(lambda: condition(cluster, "idle", "ScalingActive").get("reason") == "QpsMissing",
                   "without demand the pool holds")
    assert replicas(cluster, "idle") == 0
    assert condition(cluster, "idle", "Ready")["reason"] == "ScaledToZero"

    async with gateway_demand(redis_server, operator.release, "idle"):
        await wait_for(lambda: replicas(cluster, "idle") == 1, "the demand brings the first replica")
        status = await wait_for(lambda: (stored(cluster, POOLS, "idle") or {}).get("status", {}).get("observedQPS")
                                and stored(cluster, POOLS, "idle")["status"], "the pool shows the demand")
    assert status["observedQPS"] > 0 and replicas(cluster, "idle") == 1  # about 10 QPS: one replica serves it


async def test_requests_waiting_in_ready_engines_add_pods(cluster, operator, redis_server):
    await create_pool(cluster, "busy", {**H100, "minReplicas": 5})
    async with pods_become_ready(cluster, "busy-engine"):
        set_qps(redis_server, operator, "busy", 400)  # 80 per replica of 5: the QPS alone wants no more
        client = redis.Redis.from_url(redis_server)
        register_engine(client, operator.release, "busy-1", {"pool": "busy", "waiting": 300}, ttl_s=120)
        client.close()
        status = await wait_for(lambda: ((stored(cluster, POOLS, "busy") or {}).get("status", {}).get("desiredReplicas")
                                         or 0) > 5 and stored(cluster, POOLS, "busy")["status"], "the queue adds a pod")
        scaling = next(c for c in status["conditions"] if c["type"] == "ScalingActive")
        assert "300 requests waiting" in scaling["message"]
        await wait_for(lambda: replicas(cluster, "busy") > 5, "the Deployment has it")


async def test_what_the_operator_stops_building_leaves_the_engines_pod_spec(cluster, redis_server):
    """An upgrade that turns CURVE off restarts the operator without the transport Secret: the
    engines it resumes must lose the key's env entry (a strategic merge would keep it by name,
    and the pods would then wait for a Secret the chart deleted)."""
    def engine_env() -> list[str]:
        deployment = stored(cluster, DEPLOYMENTS, "h100-engine") or {}
        containers = deployment.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [{}])
        return [entry["name"] for entry in containers[0].get("env", [])]

    async with running_operator(cluster, operator_config(redis_server, curve_secret="k25-transport")):
        await create_pool(cluster, "h100", H100)
        await wait_for(lambda: "K25_CURVE_SECRET_KEY" in engine_env(), "the engines get the key")
    async with running_operator(cluster, operator_config(redis_server)):
        await wait_for(lambda: engine_env() and "K25_CURVE_SECRET_KEY" not in engine_env(), "the key's entry goes")
    assert {"K25_RELEASE", "POD_IP", "K25_REDIS_URL"} <= set(engine_env())
    # the emulator replaces lists whatever the patch type; a real API server merges them by
    # name under the client's default strategic merge, so the patch type is the point
    patches = [r for r in cluster if r.method == "PATCH" and r.resource and r.resource.plural == "deployments"
               and not r.subresource]
    assert patches and {r.headers.get("Content-Type") for r in patches} == {"application/merge-patch+json"}


async def test_deleting_the_pool_deletes_its_deployment(cluster, operator):
    await create_pool(cluster, "h100", H100)
    await wait_for(lambda: stored(cluster, DEPLOYMENTS, "h100-engine"), "the Deployment appears")
    response = await cluster.delete(f"/apis/k25.io/v1alpha1/namespaces/{NS}/enginepools/h100")
    assert response.status == 200
    await wait_for(lambda: stored(cluster, DEPLOYMENTS, "h100-engine") is None, "the Deployment goes")
    await wait_for(lambda: stored(cluster, POOLS, "h100") is None, "the pool goes once the operator let it")


async def test_pods_without_a_gpu_node_make_the_pool_say_so_and_not_ready(cluster, operator, redis_server):
    await create_pool(cluster, "a100", {**H100, "nodeType": "A100-80G"})
    await wait_for(lambda: stored(cluster, DEPLOYMENTS, "a100-engine"), "the Deployment appears")
    set_qps(redis_server, operator, "a100", 10)
    message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    await cluster.post(f"/api/v1/namespaces/{NS}/pods", json={
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "a100-engine-x1", "namespace": NS, "labels": {"k25.io/pool": "a100"}},
        "status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]},
    })
    ready = await wait_for(lambda: condition(cluster, "a100", "Ready").get("reason") == "Unschedulable"
                           and condition(cluster, "a100", "Ready"), "the pool says why it is not ready")
    assert ready["status"] == "False" and message in ready["message"]
    assert condition(cluster, "a100", "Schedulable") | {"lastTransitionTime": None} == {
        "type": "Schedulable", "status": "False", "reason": "Unschedulable", "message": message,
        "lastTransitionTime": None}


async def test_without_qps_data_the_pool_holds_and_says_so(cluster, operator):
    await create_pool(cluster, "quiet", {**H100, "minReplicas": 2})
    scaling = await wait_for(lambda: condition(cluster, "quiet", "ScalingActive").get("reason") == "QpsMissing"
                             and condition(cluster, "quiet", "ScalingActive"), "the missing data is reported")
    assert scaling["status"] == "False"
    assert replicas(cluster, "quiet") == 2


async def test_an_invalid_pool_gets_no_deployment_and_says_why(cluster, operator):
    await create_pool(cluster, "odd", {**H100, "nodeType": "MI300X"})
    ready = await wait_for(lambda: condition(cluster, "odd", "Ready").get("reason") == "InvalidSpec"
                           and condition(cluster, "odd", "Ready"), "the spec error is reported")
    assert "maxChunkPerGpu" in ready["message"]
    assert stored(cluster, DEPLOYMENTS, "odd-engine") is None


async def test_kubectl_scale_sets_the_size_within_bounds(cluster, operator):
    await create_pool(cluster, "h100", H100)
    await wait_for(lambda: replicas(cluster, "h100") == 1, "the Deployment appears")
    # a scale that lands while kopf still handles the creation is folded into it and never
    # seen as an update (handlers.py keeps the Deployment's size then): wait until it is done
    await wait_for(lambda: "kopf.zalando.org/last-handled-configuration"
                   in stored(cluster, POOLS, "h100")["metadata"].get("annotations", {}), "the creation is handled")
    await cluster.patch(f"/apis/k25.io/v1alpha1/namespaces/{NS}/enginepools/h100/scale",
                        json={"spec": {"replicas": 40}})
    await wait_for(lambda: replicas(cluster, "h100") == 10, "scaled by hand, up to maxReplicas")


async def test_two_operator_replicas_never_fight(cluster, redis_server):
    """With kopf peering, the replica of lower priority stands by while the other works."""
    await create_peering(cluster, "test")
    config = operator_config(redis_server)
    url = str(cluster.url).rstrip("/")
    low, high = (RecordingKube(kubernetes.client.Configuration(host=url)) for _ in range(2))
    async with (running_operator(cluster, config, priority=100, kube=low),
                running_operator(cluster, config, priority=200, kube=high)):
        await wait_for(lambda: peers(cluster, "test") == 2, "both replicas announce themselves")
        await create_pool(cluster, "h100", H100)
        set_qps(redis_server, config, "h100", 400)
        await wait_for(lambda: replicas(cluster, "h100") == 5, "the pool is served and scaled")
        assert len(high.writes) >= 2 and low.writes == []


async def test_a_pool_naming_an_image_outside_the_allowed_repositories_gets_no_deployment(cluster, redis_server):
    config = operator_config(redis_server, allowed_images=("registry.example/k25-engine", "registry.example/team/*"))
    async with running_operator(cluster, config):
        await create_pool(cluster, "ours", {**H100, "image": "registry.example/k25-engine:1.2"})
        await create_pool(cluster, "team", {**H100, "image": "registry.example/team/engine@sha256:" + "0" * 64})
        await create_pool(cluster, "theirs", {**H100, "image": "attacker.example/k25-engine:1.2"})
        ready = await wait_for(lambda: condition(cluster, "theirs", "Ready").get("reason") == "InvalidSpec"
                               and condition(cluster, "theirs", "Ready"), "the refusal is reported")
        await wait_for(lambda: stored(cluster, DEPLOYMENTS, "ours-engine") and stored(cluster, DEPLOYMENTS, "team-engine"),
                       "the allowed pools get their Deployments")
    assert "'attacker.example/k25-engine:1.2' is not from an allowed repository" in ready["message"]
    assert stored(cluster, DEPLOYMENTS, "theirs-engine") is None


async def test_a_new_engine_template_waits_while_another_pool_of_the_release_rolls_out(cluster, operator):
    """An upgrade that changes every pool's template restarts one pool's engines at a time."""
    await create_pool(cluster, "a", H100)
    await create_pool(cluster, "b", H100)
    await wait_for(lambda: stored(cluster, DEPLOYMENTS, "a-engine") and stored(cluster, DEPLOYMENTS, "b-engine"),
                   "both Deployments appear")
    # a is mid-rollout: one pod on the new template, not available yet
    await cluster.patch(f"/apis/apps/v1/namespaces/{NS}/deployments/a-engine/status",
                        json={"status": {"replicas": 2, "updatedReplicas": 1, "availableReplicas": 1}})

    def image(deployment: str) -> str:
        return stored(cluster, DEPLOYMENTS, deployment)["spec"]["template"]["spec"]["containers"][0]["image"]

    await cluster.patch(f"/apis/k25.io/v1alpha1/namespaces/{NS}/enginepools/b", json={"spec": {"image": "k25:2"}})

    def told_to_wait() -> bool:
        progress = (stored(cluster, POOLS, "b")["metadata"].get("annotations") or {})
        return any("reconcile_workload" in key and "waiting for a-engine to finish rolling out" in value
                   for key, value in progress.items())

    await wait_for(told_to_wait, "b's handler is told to wait for a")
    assert image("b-engine") == "k25:latest"
    await cluster.patch(f"/apis/apps/v1/namespaces/{NS}/deployments/a-engine/status",
                        json={"status": {"replicas": 1, "updatedReplicas": 1, "availableReplicas": 1}})
    await wait_for(lambda: image("b-engine") == "k25:2", "b rolls once a is done")
