"""How the chart's pods stop and what they ask of their nodes: a gateway serves on while its
endpoints are withdrawn (preStop), then lets requests in flight run to their deadline (its grace
period covers both); every pool's engines drain for that same deadline unless the pool says
otherwise, ask for CPU and memory, and take a priority class when one is named; each EnginePool
valid against the CRD and read by the operator as the chart meant; each pool's disruption budget
covers its engine pods (a LeaderWorkerSet's leaders and workers too) and no others."""

import pytest
import yaml

from k25.cli import build_parser
from operators.pool_spec import parse_pool_spec
from tests.helpers.crd_schema import crd_for, custom_resource_errors
from tests.helpers.helm_chart import (
    VALUE_SETS,
    engine_workloads,
    of_kind,
    pod_templates,
    render_error,
    rendered,
    rendered_with,
    value_set_id,
)
from tests.helpers.network_policy import selects

CPU_POOL = {"name": "cpu", "nodeType": "CPU", "chunkSize": 256, "maxChunkPerGpu": 4, "gpusPerReplica": 0}


def gateway_pod(objects) -> dict:
    deployment = next(d for d in of_kind(objects, "Deployment") if d["metadata"]["name"].endswith("-gateway"))
    return deployment["spec"]["template"]["spec"]


def pools(objects) -> dict[str, dict]:
    crds = of_kind(objects, "CustomResourceDefinition")
    found = {}
    for pool in of_kind(objects, "EnginePool"):
        assert custom_resource_errors(pool, crd_for(pool, crds)) == []
        found[pool["metadata"]["name"]] = pool["spec"]
    return found


def test_a_gateway_drains_for_its_request_deadline_after_its_pre_stop_sleep():
    pod = gateway_pod(rendered(None))
    container = pod["containers"][0]
    args = build_parser().parse_args(container["args"][1:])
    assert container["lifecycle"]["preStop"] == {"sleep": {"seconds": 5}}
    assert (args.request_timeout_s, args.drain_timeout_s) == (600, None)  # None: the drain is the deadline
    assert pod["terminationGracePeriodSeconds"] == 5 + 600 + 5


def test_the_request_deadline_sets_the_gateways_and_every_pools_drain(tmp_path):
    objects = rendered_with(yaml.safe_dump({
        "gateway": {"requestTimeoutS": 120, "preStopSleepS": 10},
        "engine": {"pools": [CPU_POOL, {**CPU_POOL, "name": "short", "drainTimeoutSeconds": 30}]}}), tmp_path)
    pod = gateway_pod(objects)
    assert build_parser().parse_args(pod["containers"][0]["args"][1:]).request_timeout_s == 120
    assert pod["terminationGracePeriodSeconds"] == 135
    assert {name: parse_pool_spec(spec).drain_timeout_s for name, spec in pools(objects).items()} == {
        "cpu": 120, "short": 30}


def test_engines_ask_for_cpu_and_memory_and_take_the_priority_class_named(tmp_path):
    by_default = {name: parse_pool_spec(spec) for name, spec in pools(rendered(None)).items()}
    # 4Gi and the KV host tier's 4 GiB by default
    assert all(spec.resources == {"requests": {"cpu": "1", "memory": "8Gi"}} and spec.priority_class_name is None
               for spec in by_default.values())
    own = {"requests": {"cpu": 8, "memory": "48Gi"}, "limits": {"memory": "64Gi"}}
    objects = rendered_with(yaml.safe_dump({"engine": {
        "resources": {"requests": {"cpu": "2", "memory": "8Gi"}}, "priorityClassName": "inference",
        "pools": [CPU_POOL, {**CPU_POOL, "name": "big", "resources": own, "priorityClassName": "batch"}]}}), tmp_path)
    parsed = {name: parse_pool_spec(spec) for name, spec in pools(objects).items()}
    assert (parsed["cpu"].resources, parsed["cpu"].priority_class_name) == (
        {"requests": {"cpu": "2", "memory": "8Gi"}}, "inference")
    assert (parsed["big"].resources, parsed["big"].priority_class_name) == (
        {"requests": {"cpu": "8", "memory": "48Gi"}, "limits": {"memory": "64Gi"}}, "batch")


def test_gpus_in_an_engines_resources_are_refused_by_the_chart(tmp_path):
    message = render_error(yaml.safe_dump({"engine": {"pools": [{**CPU_POOL, "resources": {
        "limits": {"nvidia.com/gpu": 1}}}]}}), tmp_path)
    assert "/engine/pools/0/resources/limits" in message


def test_the_gateway_and_the_chunker_survive_a_node_drain():
    """Two replicas each, spread over nodes, and a budget that lets a drain evict one at a time."""
    objects = rendered(None)
    budgets = {b["metadata"]["name"]: b["spec"] for b in of_kind(objects, "PodDisruptionBudget")}
    for component in ("gateway", "chunker"):
        deployment = next(d for d in of_kind(objects, "Deployment") if d["metadata"]["name"].endswith(f"-{component}"))
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert budgets[deployment["metadata"]["name"]] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
        [spread] = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
        assert spread["labelSelector"] == {"matchLabels": selector} and spread["whenUnsatisfiable"] == "ScheduleAnyway"
        assert spread["topologyKey"] == "kubernetes.io/hostname"
    chunker = next(d for d in of_kind(objects, "Deployment") if d["metadata"]["name"].endswith("-chunker"))
    assert chunker["spec"]["replicas"] == 2


@pytest.mark.parametrize("values", VALUE_SETS, ids=value_set_id)
def test_each_pools_disruption_budget_covers_its_engines_and_no_others(values):
    objects = rendered(values)
    pods = {(w["metadata"]["name"], i): t["metadata"]["labels"]  # a LeaderWorkerSet's leader and workers both
            for w in engine_workloads(objects) for i, t in enumerate(pod_templates(w))}
    budgets = [b for b in of_kind(objects, "PodDisruptionBudget") if b["metadata"]["name"].endswith("-engine")]
    assert sorted(b["metadata"]["name"] for b in budgets) == sorted({name for name, _ in pods})
    for budget in budgets:
        covered = {key for key, labels in pods.items() if selects(budget["spec"]["selector"], labels)}
        assert covered == {key for key in pods if key[0] == budget["metadata"]["name"]}
