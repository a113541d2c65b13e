"""The chart through real `helm lint` and `helm template`, for the default values and every
charts/k25/ci value set: each rendered object valid for Kubernetes 1.30 and the newest
schemas kubernetes-validate has (strict: unknown fields fail), custom resources valid
against their CRDs, and the operator's Deployment (or LeaderWorkerSet, for a pool over several
nodes) for each rendered pool valid too."""


import kubernetes_validate.utils as kv
import pytest
import yaml

from k25.cli import build_parser
from tests.helpers.crd_schema import as_json_schema, crd_for, custom_resource_errors
from tests.helpers.helm_chart import (
    CHART,
    CI_VALUES,
    LORA_VALUES,
    VALUE_SETS,
    engine_workloads,
    helm,
    of_kind,
    rendered,
    value_set_id,
    values_args,
)
from tests.helpers.leader_worker_set import api_errors as leader_worker_set_errors
from tests.helpers.leader_worker_set import container_args, lws_environment, pod_template
from tests.helpers.paths import CRDS, K8S

KUBERNETES_VERSIONS = ["1.30", kv.latest_version()]
K8S = K8S
EXAMPLES = sorted((K8S / "examples").glob("*.yaml"))
CRD_NAMES = {d["metadata"]["name"] for p in CRDS.glob("*.yaml") for d in yaml.safe_load_all(p.read_text())}
# kinds no schema here describes: checked by hand in tests/test_chart_wiring.py
CHECKED_ELSEWHERE = {("monitoring.coreos.com/v1", "ServiceMonitor")}
MULTI_NODE_VALUES = CHART / "ci" / "multi-node-values.yaml"
value_sets = pytest.mark.parametrize("values", VALUE_SETS, ids=value_set_id)


def kubernetes_errors(obj: dict, version: str) -> list[str]:
    try:
        kv.validate(obj, version, strict=True)
    except kv.ValidationError as exc:
        return [f"{'.'.join(map(str, exc.path))}: {exc.message}"]
    return []


def has_kubernetes_schema(obj: dict) -> bool:
    try:
        kv.validate(obj, KUBERNETES_VERSIONS[-1], strict=True)
    except kv.SchemaNotFoundError:
        return False
    except kv.ValidationError:
        pass
    return True



def test_there_are_at_least_five_ci_value_sets():
    names = {value_set_id(v) for v in CI_VALUES}
    assert {"external-redis", "cpu-dev", "ingress", "observability", "many-pools", "lora"} <= names


@value_sets
def test_helm_lint_passes(values):
    result = helm("lint", str(CHART), "--strict", *values_args(values))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


def rendered_problems(objects, version: str) -> dict[str, list[str]]:
    """Each rendered object's errors against Kubernetes' schema, or its CRD's; {} when all are valid."""
    crds = of_kind(objects, "CustomResourceDefinition")
    problems = {}
    for obj in objects:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if has_kubernetes_schema(obj):
            errors = kubernetes_errors(obj, version)
        elif crd_for(obj, crds) is not None:
            errors = custom_resource_errors(obj, crd_for(obj, crds))
        else:
            assert (obj["apiVersion"], obj["kind"]) in CHECKED_ELSEWHERE, f"nothing checks {where}"
            errors = []
        if errors:
            problems[where] = errors
    return problems


@value_sets
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_rendered_object_is_valid_kubernetes(values, version):
    objects = rendered(values)
    assert {c["metadata"]["name"] for c in of_kind(objects, "CustomResourceDefinition")} == CRD_NAMES
    assert rendered_problems(objects, version) == {}


def workload_errors(workload: dict, version: str) -> list[str]:
    """A Deployment against Kubernetes' schema; a LeaderWorkerSet against the LWS v1 API's fields
    and its pod templates against Kubernetes' schema (tests/helpers/leader_worker_set.py)."""
    if workload["kind"] == "LeaderWorkerSet":
        return leader_worker_set_errors(workload, version)
    return kubernetes_errors(workload, version)


@value_sets
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_workloads_the_operator_builds_for_the_pools_are_valid(values, version):
    workloads = engine_workloads(rendered(values))
    assert workloads
    assert {w["metadata"]["name"]: workload_errors(w, version) for w in workloads} == {
        w["metadata"]["name"]: [] for w in workloads}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_a_vllm_pool_over_four_gpus_and_one_over_two_nodes_render_valid(version):
    """ci/multi-node-values.yaml: every object the chart renders valid for Kubernetes (and the
    EnginePools for their CRD), the one-node pool's Deployment for Kubernetes, the two-node pool's
    LeaderWorkerSet for the LWS v1 API and Kubernetes' pod template schema, each pod's `k25 engine`
    flags as the CLI reads them once the kubelet has expanded them."""
    objects = rendered(MULTI_NODE_VALUES)
    assert rendered_problems(objects, version) == {}
    workloads = {w["metadata"]["name"]: w for w in engine_workloads(objects)}
    tp4, two_nodes = workloads["h100-tp4-engine"], workloads["h100-two-nodes-engine"]
    assert (tp4["kind"], two_nodes["kind"]) == ("Deployment", "LeaderWorkerSet")
    assert workload_errors(tp4, version) == [] and workload_errors(two_nodes, version) == []
    pods = {"tp4": tp4["spec"]["template"]["spec"]["containers"][0]["args"]} | {
        f"node {worker}": container_args(pod_template(two_nodes, role), lws_environment(two_nodes, 0, worker))
        for role, worker in (("leader", 0), ("worker", 1))}
    read = {name: build_parser().parse_args(args[1:]) for name, args in pods.items()}
    assert {name: (p.backend, p.tensor_parallel_size, p.pipeline_parallel_size, p.nnodes, p.node_rank)
            for name, p in read.items()} == {"tp4": ("vllm", 4, 1, 1, 0), "node 0": ("vllm", 4, 2, 2, 0),
                                             "node 1": ("vllm", 4, 2, 2, 1)}
    gpus = [tp4["spec"]["template"]] + [pod_template(two_nodes, role) for role in ("leader", "worker")]
    assert [t["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] for t in gpus] == ["4", "4", "4"]


@value_sets
def test_the_crds_are_valid_against_their_own_meta_schema(values):
    """Each CRD's openAPIV3Schema is itself a schema the validator accepts."""
    import jsonschema

    for crd in of_kind(rendered(values), "CustomResourceDefinition"):
        for version in crd["spec"]["versions"]:
            jsonschema.Draft202012Validator.check_schema(as_json_schema(version["schema"]["openAPIV3Schema"]))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_the_k8s_examples_are_valid_against_the_crd(path):
    crds = of_kind(rendered(None), "CustomResourceDefinition")
    for example in yaml.safe_load_all(path.read_text()):
        crd = crd_for(example, crds)
        assert crd is not None, f"{path.name}: no CRD serves {example['apiVersion']} {example['kind']}"
        assert custom_resource_errors(example, crd) == []


def test_the_validators_can_fail():
    """Strict Kubernetes validation refuses a misspelt field; the CRD check a bad pool."""
    objects = rendered(None)
    deployment = dict(of_kind(objects, "Deployment")[0])
    deployment["spec"] = {**deployment["spec"], "replica": 2}
    assert kubernetes_errors(deployment, KUBERNETES_VERSIONS[0])
    crds = of_kind(objects, "CustomResourceDefinition")
    pool = of_kind(objects, "EnginePool")[0]
    too_small = {**pool, "spec": {**pool["spec"], "chunkSize": 0}}
    assert any("chunkSize" in e for e in custom_resource_errors(too_small, crd_for(pool, crds)))
    unprofiled = {**pool, "spec": {k: v for k, v in pool["spec"].items() if k != "maxChunkPerGpu"} | {"nodeType": "MI300X"}}
    assert any("maxChunkPerGpu is required" in e for e in custom_resource_errors(unprofiled, crd_for(pool, crds)))
    no_qps = {**pool, "spec": {**pool["spec"], "targetQPSPerReplica": 0}}
    assert custom_resource_errors(no_qps, crd_for(pool, crds))
    greedy = {**pool, "spec": {**pool["spec"], "lora": {"maxLoras": 16}}}  # CEL, a level down: maxCpuLoras 8
    assert any("lora.maxCpuLoras must be at least lora.maxLoras" in e for e in custom_resource_errors(greedy, crd_for(pool, crds)))
    rollout = of_kind(rendered(LORA_VALUES), "AdapterRollout")[0]
    unfinished = {**rollout, "spec": {**rollout["spec"], "steps": [5, 20, 50]}}
    assert any("steps must end at 100" in e for e in custom_resource_errors(unfinished, crd_for(rollout, crds)))
