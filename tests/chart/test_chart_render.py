"""The chart through real `helm lint` and `helm template`, for the default values and every
charts/k25/ci value set: each rendered object valid for Kubernetes 1.30 and the newest
schemas kubernetes-validate has (strict: unknown fields fail), custom resources valid
against their CRDs, and the operator's Deployment for each rendered pool valid too."""


import kubernetes_validate.utils as kv
import pytest
import yaml

from tests.helpers.crd_schema import as_json_schema, crd_for, custom_resource_errors
from tests.helpers.helm_chart import (
    CHART,
    CI_VALUES,
    LORA_VALUES,
    VALUE_SETS,
    engine_deployments,
    helm,
    of_kind,
    rendered,
    value_set_id,
    values_args,
)
from tests.helpers.paths import CRDS, K8S

KUBERNETES_VERSIONS = ["1.30", kv.latest_version()]
K8S = K8S
EXAMPLES = sorted((K8S / "examples").glob("*.yaml"))
CRD_NAMES = {d["metadata"]["name"] for p in CRDS.glob("*.yaml") for d in yaml.safe_load_all(p.read_text())}
# kinds no schema here describes: checked by hand in tests/test_chart_wiring.py
CHECKED_ELSEWHERE = {("monitoring.coreos.com/v1", "ServiceMonitor")}
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


@value_sets
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_rendered_object_is_valid_kubernetes(values, version):
    objects = rendered(values)
    crds = of_kind(objects, "CustomResourceDefinition")
    assert {c["metadata"]["name"] for c in crds} == CRD_NAMES
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
    assert problems == {}


@value_sets
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_deployments_the_operator_builds_for_the_pools_are_valid(values, version):
    deployments = engine_deployments(rendered(values))
    assert deployments
    assert {d["metadata"]["name"]: kubernetes_errors(d, version) for d in deployments} == {
        d["metadata"]["name"]: [] for d in deployments}


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
