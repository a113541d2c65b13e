"""The chart's operator handles its own release only: its EnginePools and AdapterRollouts carry
the release label the operator selects, its peering record is the release's own, and by
default (operator.watchNamespace release) it watches the release's namespace under a Role,
with no cluster-wide permission; watchNamespace all, chosen explicitly, gives it a ClusterRole.
The engine pods it builds from the chart's pools drain and probe as their pool says."""

import pytest
import yaml

from k25.cli import build_parser
from operators.config import RELEASE_LABEL
from operators.image_policy import image_refusal
from operators.runtime import peering_name
from tests.helpers.helm_chart import (
    CHART,
    LORA_VALUES,
    NAMESPACE,
    RELEASE,
    engine_deployments,
    helm,
    named,
    of_kind,
    rendered,
    rendered_with,
)
from tests.helpers.paths import K8S

CLUSTER_SCOPED = ("customresourcedefinitions", "namespaces")
NAMESPACED = "operator:\n  watchNamespace: release\n"
CLUSTER_WIDE = "operator:\n  watchNamespace: all\n"


def reference_rules() -> list[dict]:
    documents = yaml.safe_load_all((K8S / "rbac" / "operator.yaml").read_text())
    return next(d for d in documents if d["kind"] == "ClusterRole")["rules"]


def operator_args(objects) -> list[str]:
    return named(objects, "Deployment", f"{RELEASE}-operator")["spec"]["template"]["spec"]["containers"][0]["args"]


def test_the_charts_pools_and_rollouts_carry_the_release_the_operator_handles():
    objects = rendered(LORA_VALUES)
    release = build_parser().parse_args(operator_args(objects)[1:]).release
    labelled = of_kind(objects, "EnginePool") + of_kind(objects, "AdapterRollout")
    assert {r["kind"] for r in labelled} == {"EnginePool", "AdapterRollout"}
    assert {r["metadata"]["labels"][RELEASE_LABEL] for r in labelled} == {release} == {RELEASE}


def test_by_default_the_operators_rbac_names_only_the_release_namespace():
    objects = rendered(None)
    assert build_parser().parse_args(operator_args(objects)[1:]).namespace == [NAMESPACE]
    assert not of_kind(objects, "ClusterRole") and not of_kind(objects, "ClusterRoleBinding")
    assert not of_kind(objects, "ClusterKopfPeering")
    assert [r["kind"] for r in objects if r["kind"] in ("Role", "RoleBinding")] == ["Role", "RoleBinding"]
    assert named(objects, "RoleBinding", f"{RELEASE}-operator")["roleRef"]["kind"] == "Role"


def test_watching_every_namespace_is_an_explicit_choice_of_a_cluster_role(tmp_path):
    objects = rendered_with(CLUSTER_WIDE, tmp_path)
    assert "--namespace" not in operator_args(objects)
    assert not of_kind(objects, "Role") and not of_kind(objects, "KopfPeering")
    assert [p["metadata"]["name"] for p in of_kind(objects, "ClusterKopfPeering")] == [peering_name(RELEASE)]


def test_a_second_release_has_its_own_peering_record_and_the_rights_on_it(tmp_path):
    values = tmp_path / "values.yaml"
    values.write_text(CLUSTER_WIDE)
    result = helm("template", "canary", str(CHART), "--namespace", NAMESPACE, "--values", str(values))
    assert result.returncode == 0, result.stderr
    objects = [d for d in yaml.safe_load_all(result.stdout) if d]
    [peering] = of_kind(objects, "ClusterKopfPeering")
    assert peering["metadata"]["name"] == peering_name("canary") != peering_name(RELEASE)
    [role] = of_kind(objects, "ClusterRole")
    assert [r["resourceNames"] for r in role["rules"] if "resourceNames" in r] == [[peering_name("canary")]]
    assert {p["metadata"]["labels"][RELEASE_LABEL] for p in of_kind(objects, "EnginePool")} == {"canary"}


def test_watching_the_release_namespace_needs_only_a_role_there(tmp_path):
    objects = rendered_with(NAMESPACED, tmp_path)
    parsed = build_parser().parse_args(operator_args(objects)[1:])
    assert parsed.namespace == [NAMESPACE]
    assert not of_kind(objects, "ClusterRole") and not of_kind(objects, "ClusterRoleBinding")
    role = named(objects, "Role", f"{RELEASE}-operator")
    # the cluster-wide rules less the cluster-scoped resources, the peering record a namespaced one
    expected = [{**rule, "resources": ["kopfpeerings" if r == "clusterkopfpeerings" else r for r in rule["resources"]]}
                for rule in reference_rules() if not set(rule["resources"]) & set(CLUSTER_SCOPED)]
    assert role["rules"] == expected
    binding = named(objects, "RoleBinding", f"{RELEASE}-operator")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{RELEASE}-operator"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"{RELEASE}-operator", "namespace": NAMESPACE}]
    assert [p["metadata"]["name"] for p in of_kind(objects, "KopfPeering")] == [peering_name(RELEASE)]
    assert not of_kind(objects, "ClusterKopfPeering")


def test_a_pools_drain_timeout_and_model_digests_reach_its_engine_pods(tmp_path):
    digest = "0123456789abcdef" * 4
    objects = rendered_with("engine:\n  pools:\n    - {name: h100, nodeType: H100-80G, chunkSize: 8192, "
                            f"drainTimeoutSeconds: 90, modelSha256: {{SmolLM2-135M-Instruct.Q4_1.gguf: {digest}}}}}\n",
                            tmp_path)
    [pod] = [d["spec"]["template"]["spec"] for d in engine_deployments(objects)]
    assert pod["terminationGracePeriodSeconds"] == 105
    parsed = build_parser().parse_args(pod["containers"][0]["args"][1:])
    assert parsed.drain_timeout_s == 90 and parsed.model_sha256 == [f"SmolLM2-135M-Instruct.Q4_1.gguf={digest}"]
    assert pod["containers"][0]["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}


@pytest.mark.parametrize("values", [None, LORA_VALUES], ids=["default", "lora"])
def test_by_default_engines_drain_for_the_gateways_600_second_deadline_within_a_615_second_grace_period(values):
    for deployment in engine_deployments(rendered(values)):
        assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 615


def test_the_operator_runs_only_the_charts_engine_images_and_those_allowed(tmp_path):
    """Every pool the chart makes passes the operator's image check; another image would not."""
    values = ("engineImage:\n  repository: registry.example/k25-engine\n  tag: '1.0'\n"
              "operator:\n  allowedImages: ['registry.example/team/*']\n"
              "engine:\n  pools:\n"
              "    - {name: cpu, nodeType: CPU, chunkSize: 256}\n"
              "    - {name: own, nodeType: CPU, chunkSize: 256, image: 'mirror:5000/k25/engine-cpu:2@sha256:"
              + "0" * 64 + "'}\n")
    objects = rendered_with(values, tmp_path)
    allowed = tuple(build_parser().parse_args(operator_args(objects)[1:]).allowed_images)
    assert allowed == ("registry.example/k25-engine", "k25-engine-vllm", "mirror:5000/k25/engine-cpu", "registry.example/team/*")
    assert [image_refusal(p["spec"]["image"], allowed) for p in of_kind(objects, "EnginePool")] == [None, None]
    assert image_refusal("attacker.example/k25-engine:1.0", allowed) is not None
