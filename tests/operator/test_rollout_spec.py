"""The AdapterRollout CRD, its example and the operator's own spec checks: both refuse the
same bad specs. The schema runs through `jsonschema`, the CEL rules through a real CEL evaluator
(cel-python), and `x-kubernetes-list-type: set` is checked as the API server does (no
duplicates), all in tests/crd_schema.py."""


import kubernetes_validate
import pytest
import yaml

from operators.rollout_spec import RolloutSpecError, parse_rollout_spec
from tests.helpers.crd_schema import cel_errors, custom_resource_errors, with_defaults
from tests.helpers.paths import CRDS, K8S

K8S = K8S
CRD = yaml.safe_load((CRDS / "adapterrollout.yaml").read_text())
VERSION = CRD["spec"]["versions"][0]
SPEC_SCHEMA = VERSION["schema"]["openAPIV3Schema"]["properties"]["spec"]
EXAMPLES = sorted((K8S / "examples").glob("adapterrollout-*.yaml"))
SHA = "0123456789abcdef" * 4
VALID = {"adapter": "legal", "pool": "h100", "stable": {"version": "v1", "source": "legal/v1", "sha256": SHA},
         "canary": {"version": "v2", "source": "legal/v2", "sha256": SHA}}


def api_server_errors(spec: dict) -> list[str]:
    obj = {"apiVersion": "k25.io/v1alpha1", "kind": "AdapterRollout", "metadata": {"name": "x"}, "spec": spec}
    return custom_resource_errors(obj, CRD)


def test_crd_serves_k25_io_v1alpha1_namespaced_with_status():
    assert (CRD["spec"]["group"], VERSION["name"], CRD["spec"]["scope"]) == ("k25.io", "v1alpha1", "Namespaced")
    assert CRD["spec"]["names"]["plural"] == "adapterrollouts" and VERSION["subresources"] == {"status": {}}


@pytest.mark.parametrize("version", ["1.30", kubernetes_validate.latest_version()])
def test_the_crd_is_a_valid_kubernetes_object(version):
    kubernetes_validate.validate(CRD, version, strict=True)


def test_printer_columns_show_adapter_versions_weight_phase_and_age():
    columns = {c["name"]: c["jsonPath"] for c in VERSION["additionalPrinterColumns"]}
    assert {k: columns[k] for k in ("Adapter", "Stable", "Canary", "Weight", "Phase", "Age")} == {
        "Adapter": ".spec.adapter", "Stable": ".spec.stable.version", "Canary": ".spec.canary.version",
        "Weight": ".status.weight", "Phase": ".status.phase", "Age": ".metadata.creationTimestamp"}


def test_a_minimal_spec_is_accepted_with_the_documented_defaults():
    assert api_server_errors(VALID) == []
    crd_defaults = with_defaults(SPEC_SCHEMA, VALID)
    spec = parse_rollout_spec(VALID)
    assert crd_defaults["steps"] == list(spec.steps) == [5, 20, 50, 100]
    assert (crd_defaults["interval"], spec.interval_s) == (60, 60)
    assert (crd_defaults["maxErrorRate"], spec.max_error_rate) == (0.01, 0.01)
    assert (crd_defaults["maxP95LatencyMs"], spec.max_p95_latency_s) == (10000, 10.0)
    assert (crd_defaults["minRequestsPerStep"], spec.min_requests_per_step) == (100, 100)
    assert (crd_defaults["maxRequestsPerTenant"], spec.max_requests_per_tenant) == (10, 10)
    assert (crd_defaults["failureThreshold"], spec.failure_threshold) == (3, 3)
    assert (crd_defaults["allowList"], spec.allow_list) == ([], ())


BAD = [
    ({"steps": [20, 5, 100]}, "steps must be increasing", "strictly increasing"),
    ({"steps": [5, 5, 100]}, "duplicate", "strictly increasing"),
    ({"steps": [5, 20, 50]}, "steps must end at 100", "must end at 100"),
    ({"steps": [0, 100]}, "minimum", "percents 1..100"),
    ({"steps": [5, 101]}, "maximum", "percents 1..100"),
    ({"steps": []}, "non-empty", "non-empty list"),
    ({"interval": 0}, "minimum", "spec.interval must be from 1 to 300"),
    ({"interval": 301}, "maximum", "spec.interval must be from 1 to 300"),
    ({"interval": "1m"}, "not of type", "spec.interval must be an integer"),
    ({"maxErrorRate": 1.5}, "maximum", "spec.maxErrorRate must be from 0 to 1"),
    ({"maxErrorRate": -0.1}, "minimum", "spec.maxErrorRate must be from 0 to 1"),
    ({"maxP95LatencyMs": 0}, "minimum", "spec.maxP95LatencyMs must be at least 1"),
    ({"minRequestsPerStep": 0}, "minimum", "spec.minRequestsPerStep must be at least 1"),
    ({"maxRequestsPerTenant": 0}, "minimum", "spec.maxRequestsPerTenant must be at least 1"),
    ({"failureThreshold": 0}, "minimum", "spec.failureThreshold must be at least 1"),
    ({"allowList": [""]}, "non-empty", "spec.allowList must be a list of user ids"),
    ({"adapter": "legal@v2"}, "does not match", "spec.adapter must be"),
    ({"pool": "H100"}, "does not match", "spec.pool must be a Kubernetes object name"),
    ({"canary": {"version": "v2", "source": "legal/v2", "sha256": "ABC"}}, "does not match",
     "spec.canary.sha256 must be 64 lowercase hex digits"),
    ({"canary": {"version": "v2", "source": "", "sha256": SHA}}, "non-empty", "spec.canary.source must be a non-empty"),
    ({"stable": {"version": "v 1", "source": "legal/v1", "sha256": SHA}}, "does not match", "spec.stable.version must be"),
    ({"canary": None}, "None is not of type", "spec.canary is required"),
]


@pytest.mark.parametrize("bad, crd_says, operator_says", BAD, ids=[str(b[0]) for b in BAD])
def test_bad_specs_are_refused_by_the_crd_and_the_operator(bad, crd_says, operator_says):
    errors = api_server_errors({**VALID, **bad})
    assert any(crd_says in error for error in errors), errors
    with pytest.raises(RolloutSpecError, match=operator_says.replace(".", r"\.")):
        parse_rollout_spec({**VALID, **bad})


def test_a_missing_required_field_is_refused():
    for name in ("adapter", "pool", "stable", "canary"):
        spec = {k: v for k, v in VALID.items() if k != name}
        assert any(f"'{name}' is a required property" in e for e in api_server_errors(spec))
        with pytest.raises(RolloutSpecError, match=f"spec.{name}"):
            parse_rollout_spec(spec)


def test_a_canary_of_the_stable_version_is_refused_by_the_operator():
    """The one rule the CRD leaves to the operator (a CEL rule across spec.stable and
    spec.canary would need the whole spec's scope); the operator reports it in the status."""
    same = {**VALID, "canary": {**VALID["canary"], "version": "v1"}}
    with pytest.raises(RolloutSpecError, match="spec.canary.version must differ from spec.stable.version"):
        parse_rollout_spec(same)


def test_the_cel_checker_can_fail():
    assert cel_errors(SPEC_SCHEMA, {"steps": [50, 20, 100]}) == ["spec.steps: steps must be increasing"]
    assert cel_errors(SPEC_SCHEMA, {"steps": [20, 50]}) == ["spec.steps: steps must end at 100"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_the_example_is_a_valid_rollout(path):
    rollout = yaml.safe_load(path.read_text())
    assert (rollout["apiVersion"], rollout["kind"]) == ("k25.io/v1alpha1", "AdapterRollout")
    assert api_server_errors(rollout["spec"]) == []
    spec = parse_rollout_spec(rollout["spec"])
    assert spec.steps == (5, 20, 50, 100) and spec.canary.version != spec.stable.version
    pools = {yaml.safe_load(p.read_text())["metadata"]["name"] for p in (K8S / "examples").glob("enginepool-*.yaml")}
    assert spec.pool in pools


def test_rbac_lets_the_operator_watch_rollouts_and_patch_their_status():
    documents = list(yaml.safe_load_all((K8S / "rbac" / "operator.yaml").read_text()))
    rules = next(d for d in documents if d["kind"] == "ClusterRole")["rules"]
    granted = {(group, resource, verb) for rule in rules for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    assert {("k25.io", "adapterrollouts", verb) for verb in ("list", "watch", "get", "patch")} <= granted
    assert {("k25.io", "adapterrollouts/status", verb) for verb in ("get", "patch")} <= granted
