"""The CRD, examples and RBAC as files: the schema and its CEL rules reject bad specs,
the examples are valid pools, and the RBAC grants what the operator calls.

No API server runs here, so the schema check is a small evaluator for the subset of
OpenAPI the CRD uses, and the CEL rules (three one-line boolean expressions) are
translated to Python; both are written for these files, not as general tools."""

import pathlib
import re
import types

import pytest
import yaml

from operators.pool_spec import MAX_CHUNK_PER_GPU, parse_pool_spec

K8S = pathlib.Path(__file__).resolve().parent.parent / "k8s"
CRD = yaml.safe_load((K8S / "crds" / "enginepool.yaml").read_text())
VERSION = CRD["spec"]["versions"][0]
SPEC_SCHEMA = VERSION["schema"]["openAPIV3Schema"]["properties"]["spec"]
EXAMPLES = sorted((K8S / "examples").glob("enginepool-*.yaml"))
VALID = {"nodeType": "H100-80G", "model": "m", "chunkSize": 512}


def with_defaults(schema: dict, value):
    if schema.get("type") == "object" and isinstance(value, dict):
        value = dict(value)
        for name, sub in schema.get("properties", {}).items():
            if name not in value and "default" in sub:
                value[name] = sub["default"]
            if name in value:
                value[name] = with_defaults(sub, value[name])
    return value


def schema_errors(schema: dict, value, path="spec") -> list[str]:
    kind = schema.get("type")
    checks = {"object": dict, "array": list, "string": str, "integer": int, "number": (int, float)}
    if kind in checks and (not isinstance(value, checks[kind]) or isinstance(value, bool)):
        return [f"{path}: not {kind}"]
    errors = []
    if "minimum" in schema and value < schema["minimum"] or (
            schema.get("exclusiveMinimum") and value <= schema["minimum"]):
        errors.append(f"{path}: below minimum")
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: not one of {schema['enum']}")
    if kind == "string" and len(value) < schema.get("minLength", 0):
        errors.append(f"{path}: too short")
    if kind == "object":
        errors += [f"{path}.{name}: required" for name in schema.get("required", []) if name not in value]
        for name, sub in value.items():
            sub_schema = schema.get("properties", {}).get(name, schema.get("additionalProperties"))
            if isinstance(sub_schema, dict):
                errors += schema_errors(sub_schema, sub, f"{path}.{name}")
            elif "properties" in schema:
                errors.append(f"{path}.{name}: unknown field")
    if kind == "array":
        for i, item in enumerate(value):
            errors += schema_errors(schema["items"], item, f"{path}[{i}]")
    return errors


def cel_holds(rule: str, spec: dict) -> bool:
    python = re.sub(r"has\(self\.(\w+)\)", r"('\1' in fields)", rule).replace("||", " or ").replace("&&", " and ")
    return eval(python, {}, {"self": types.SimpleNamespace(**spec), "fields": spec})  # noqa: S307


def api_server_accepts(spec: dict) -> list[str]:
    """What the API server would answer: [] or the reasons for refusing."""
    errors = schema_errors(SPEC_SCHEMA, spec)
    if errors:
        return errors
    spec = with_defaults(SPEC_SCHEMA, spec)
    return [v["message"] for v in SPEC_SCHEMA["x-kubernetes-validations"] if not cel_holds(v["rule"], spec)]


def test_crd_serves_k25_io_v1alpha1_with_status_and_scale():
    assert CRD["spec"]["group"] == "k25.io" and VERSION["name"] == "v1alpha1"
    assert VERSION["subresources"]["status"] == {}
    assert VERSION["subresources"]["scale"] == {"specReplicasPath": ".spec.replicas",
                                                "statusReplicasPath": ".status.replicas",
                                                "labelSelectorPath": ".status.selector"}


def test_printer_columns_show_node_type_replicas_ready_and_qps():
    columns = {c["name"]: c["jsonPath"] for c in VERSION["additionalPrinterColumns"]}
    assert columns["Node Type"] == ".spec.nodeType"
    assert columns["Replicas"] == ".status.replicas"
    assert columns["Ready"] == ".status.readyReplicas"
    assert columns["QPS"] == ".status.observedQPS"


def test_a_minimal_spec_is_accepted_with_the_documented_defaults():
    assert api_server_accepts(VALID) == []
    spec = with_defaults(SPEC_SCHEMA, VALID)
    assert (spec["minReplicas"], spec["maxReplicas"], spec["targetQPSPerReplica"]) == (1, 4, 80)
    assert (spec["scaleUpStabilizationSeconds"], spec["scaleDownStabilizationSeconds"]) == (0, 300)


@pytest.mark.parametrize("bad, reason", [
    ({"minReplicas": -1}, "below minimum"),
    ({"maxReplicas": 0}, "below minimum"),
    ({"replicas": -2}, "below minimum"),
    ({"targetQPSPerReplica": 0}, "below minimum"),
    ({"chunkSize": 0}, "below minimum"),
    ({"minReplicas": 5, "maxReplicas": 2}, "minReplicas must not exceed maxReplicas"),
    ({"nodeType": "MI300X"}, "maxChunkPerGpu is required"),
    ({"nodeType": "H100-80G", "gpusPerReplica": 0}, "gpusPerReplica of at least 1"),
    ({"tolerations": [{"key": "nvidia.com/gpu", "operator": "Maybe"}]}, "not one of"),
    ({"model": ""}, "too short"),
])
def test_bad_specs_are_refused(bad, reason):
    errors = api_server_accepts({**VALID, **bad})
    assert any(reason in error for error in errors), errors
    with pytest.raises(ValueError):  # and the operator refuses them too, on any server
        parse_pool_spec({**VALID, **bad})


def test_an_unknown_node_type_is_fine_with_an_explicit_max_chunk_per_gpu():
    assert api_server_accepts({**VALID, "nodeType": "MI300X", "maxChunkPerGpu": 12}) == []
    assert parse_pool_spec({**VALID, "nodeType": "MI300X", "maxChunkPerGpu": 12}).max_chunk_per_gpu == 12


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_are_valid_gpu_pools(path):
    pool = yaml.safe_load(path.read_text())
    assert (pool["apiVersion"], pool["kind"]) == ("k25.io/v1alpha1", "EnginePool")
    assert api_server_accepts(pool["spec"]) == []
    spec = parse_pool_spec(pool["spec"])
    assert spec.max_chunk_per_gpu == MAX_CHUNK_PER_GPU[spec.node_type]
    assert set(spec.node_selector) == {"nvidia.com/gpu.product"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec.tolerations
    assert spec.gpus_per_replica >= 1


def test_the_examples_cover_the_three_node_types():
    types_ = {yaml.safe_load(p.read_text())["spec"]["nodeType"]: yaml.safe_load(p.read_text())["spec"]["maxChunkPerGpu"]
              for p in EXAMPLES}
    assert types_ == {"A100-40G": 2, "A100-80G": 4, "H100-80G": 8}


def test_rbac_grants_what_the_operator_calls_and_nothing_broad():
    documents = list(yaml.safe_load_all((K8S / "rbac" / "operator.yaml").read_text()))
    rules = next(d for d in documents if d["kind"] == "ClusterRole")["rules"]
    granted = {(group, resource, verb) for rule in rules for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    used = {("k25.io", "enginepools", "watch"), ("k25.io", "enginepools", "patch"),
            ("k25.io", "enginepools/status", "patch"), ("apps", "deployments", "create"),
            ("apps", "deployments", "get"), ("apps", "deployments", "patch"), ("apps", "deployments", "delete"),
            ("apps", "deployments/scale", "patch"), ("", "pods", "list"), ("kopf.dev", "clusterkopfpeerings", "patch")}
    assert used <= granted
    assert not any("*" in (rule["verbs"] + rule["resources"] + rule["apiGroups"]) for rule in rules)
    assert not any(resource == "secrets" for _, resource, _ in granted)
