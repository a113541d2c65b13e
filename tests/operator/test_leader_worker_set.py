"""A vLLM pool over several nodes as the operator builds it: one LeaderWorkerSet group an engine,
its leader the engine gateways dial, its workers vLLM's headless workers, all started with the
same `k25 engine` arguments but their node rank, as `k25 engine` reads them once the kubelet has
filled in what LeaderWorkerSet's controller tells each pod."""

import pytest

from k25.cli import build_parser
from k25.commands.engine import invalid_flags
from operators.config import OperatorConfig
from operators.leader_worker_set import NODE_GROUP_LABEL
from operators.pool_spec import PoolSpecError, parse_pool_spec
from operators.pool_upgrade import TEMPLATE_HASH, still_rolling
from operators.workload import DEPLOYMENT, LEADER_WORKER_SET, build_workload, workload_kind, workload_patch
from tests.helpers.engine_pool import GPU_POOL, api_server_errors
from tests.helpers.leader_worker_set import api_errors, container_args, lws_environment, pod_template

POOL = {"apiVersion": "k25.io/v1alpha1", "kind": "EnginePool", "metadata": {"name": "big", "namespace": "s", "uid": "u"}}
CONFIG = OperatorConfig(release="prod", redis_url="redis://redis:6379/0", redis_secret="prod-k25-redis",
                        curve_secret="prod-k25-transport")
TWO_NODES = {**GPU_POOL, "backend": "vllm", "gpusPerReplica": 4, "nodesPerReplica": 2}


def built(spec: dict = TWO_NODES, replicas: int = 3) -> dict:
    return build_workload(POOL, parse_pool_spec(spec), replicas, CONFIG, {})


def engine_flags(lws: dict, group: int, worker: int):
    role = "leader" if worker == 0 else "worker"
    args = container_args(pod_template(lws, role), lws_environment(lws, group, worker))
    return build_parser().parse_args(args[1:])


def test_a_pool_over_one_node_is_a_deployment_and_over_several_a_leader_worker_set():
    assert workload_kind(parse_pool_spec({**TWO_NODES, "nodesPerReplica": 1})) is DEPLOYMENT
    assert workload_kind(parse_pool_spec(TWO_NODES)) is LEADER_WORKER_SET
    lws = built()
    assert (lws["apiVersion"], lws["kind"], lws["metadata"]["name"]) == ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet",
                                                                         "big-engine")
    assert lws["metadata"]["ownerReferences"][0]["uid"] == "u"
    group = lws["spec"]["leaderWorkerTemplate"]
    assert (lws["spec"]["replicas"], group["size"], group["restartPolicy"]) == (3, 2, "RecreateGroupOnPodRestart")
    assert api_errors(lws, "1.30") == []


@pytest.mark.parametrize("worker", [0, 1, 3])
def test_every_pod_of_a_group_runs_the_same_engine_but_its_node_rank(worker):
    lws = built({**TWO_NODES, "nodesPerReplica": 4, "lora": {"maxLoras": 2}})
    parsed = engine_flags(lws, group=2, worker=worker)
    assert (parsed.backend, parsed.tensor_parallel_size, parsed.pipeline_parallel_size, parsed.nnodes) == ("vllm", 4, 4, 4)
    assert (parsed.node_rank, parsed.master_addr, parsed.master_port) == (worker, "big-engine-2.big-engine.serving", 29501)
    assert invalid_flags(parsed) == ""
    leader = vars(engine_flags(lws, group=2, worker=0))
    assert {k: v for k, v in vars(parsed).items() if v != leader[k]} == ({} if worker == 0 else {"node_rank": worker})


def test_only_the_leader_serves_and_reads_the_releases_secrets():
    lws = built()
    leader, worker = (pod_template(lws, role)["spec"]["containers"][0] for role in ("leader", "worker"))
    assert {p["name"] for p in leader["ports"]} == {"zmq", "metrics", "node-group"} and "startupProbe" in leader
    assert worker["ports"] == [] and not {"startupProbe", "livenessProbe", "readinessProbe"} & set(worker)
    assert {"K25_REDIS_URL", "K25_CURVE_SECRET_KEY"} <= {e["name"] for e in leader["env"]}
    assert [e["name"] for e in worker["env"]] == ["POD_IP", "VLLM_HOST_IP"]
    for container in (leader, worker):  # vLLM's processes on each node give the others their pod's address
        assert container_args({"spec": {"containers": [{**container, "args": ["$(VLLM_HOST_IP)"]}]}}, {}) == ["10.1.2.3"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"  # a node's share: tensor parallel 4
        assert {"name": "shm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    for role in ("leader", "worker"):
        assert pod_template(lws, role)["metadata"]["labels"][NODE_GROUP_LABEL] == "big-engine"
    assert NODE_GROUP_LABEL not in lws["metadata"]["labels"]


def test_a_template_change_changes_the_hash_and_a_scale_does_not():
    hashed = built()["metadata"]["annotations"][TEMPLATE_HASH]
    assert built(replicas=5)["metadata"]["annotations"][TEMPLATE_HASH] == hashed
    assert built({**TWO_NODES, "image": "k25-engine-vllm:2"})["metadata"]["annotations"][TEMPLATE_HASH] != hashed
    assert built({**TWO_NODES, "nodesPerReplica": 3})["metadata"]["annotations"][TEMPLATE_HASH] != hashed


def test_the_patch_writes_the_group_and_the_replicas_it_keeps():
    lws = built()
    patch = workload_patch(lws, 7)
    assert patch["spec"] == {**lws["spec"], "replicas": 7}
    deployment = built({**TWO_NODES, "nodesPerReplica": 1})
    assert set(workload_patch(deployment, 2)["spec"]) == {"replicas", "template"}  # a selector cannot change


@pytest.mark.parametrize("status, rolling", [
    ({}, False),
    ({"replicas": 3, "readyReplicas": 3, "updatedReplicas": 3}, False),
    ({"replicas": 3, "readyReplicas": 2, "updatedReplicas": 3}, True),  # a group not ready yet
    ({"replicas": 3, "readyReplicas": 3, "updatedReplicas": 1}, True),  # groups on the old template
])
def test_a_leader_worker_set_rolls_until_every_group_is_updated_and_ready(status, rolling):
    assert still_rolling({**built(), "status": status}) is rolling


@pytest.mark.parametrize("spec, crd_says, operator_says", [
    ({**GPU_POOL, "nodesPerReplica": 2}, "nodesPerReplica above 1 needs backend vllm",
     "spec.nodesPerReplica 2: K25's engine runs on one node; set backend: vllm"),
    ({**TWO_NODES, "nodesPerReplica": 0}, "nodesPerReplica: 0 is less than the minimum of 1",
     "spec.nodesPerReplica must be at least 1, got 0"),
])
def test_what_the_crd_refuses_the_operator_refuses(spec, crd_says, operator_says):
    assert any(crd_says in e for e in api_server_errors(spec)), api_server_errors(spec)
    with pytest.raises(PoolSpecError, match=operator_says):
        parse_pool_spec(spec)


def test_the_checks_can_fail():
    lws = built()
    assert any("size" in e for e in api_errors({**lws, "spec": {**lws["spec"], "leaderWorkerTemplate": {
        **lws["spec"]["leaderWorkerTemplate"], "size": 0}}}, "1.30"))
    assert any("groupSize" in e for e in api_errors({**lws, "spec": {**lws["spec"], "groupSize": 2}}, "1.30"))
    worker = pod_template(lws, "worker")
    typo = {**worker, "spec": {**worker["spec"], "containers": [{**worker["spec"]["containers"][0], "argz": []}]}}
    assert api_errors({**lws, "spec": {**lws["spec"], "leaderWorkerTemplate": {
        **lws["spec"]["leaderWorkerTemplate"], "workerTemplate": typo}}}, "1.30")


def test_an_address_the_pod_is_not_told_stays_unexpanded_and_the_engine_refuses_it():
    template = pod_template(built(), "worker")
    args = container_args(template, {})  # no LeaderWorkerSet controller filled them in
    assert "$(LWS_WORKER_INDEX)" in args
    with pytest.raises(SystemExit):
        build_parser().parse_args(args[1:])
