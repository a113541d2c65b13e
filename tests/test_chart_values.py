"""values.schema.json and the chart's own checks refuse wrong values before anything is
installed, each with a message that names the value and says what is wanted; the pool
schema stays in step with the EnginePool CRD."""

import json
import re

import pytest
import yaml

from helm_chart import CHART, RELEASE, helm, render_error

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
CRD = yaml.safe_load((CHART.parent.parent / "k8s" / "crds" / "enginepool.yaml").read_text())
CRD_SPEC = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def pools(*entries: str) -> str:
    return "engine:\n  pools:\n" + "".join(f"    - {entry}\n" for entry in entries)


H100 = "{name: h100, nodeType: H100-80G, chunkSize: 8192"


@pytest.mark.parametrize("values, message", [
    # a misspelt key is an error, not silently ignored
    ("gatway:\n  replicas: 3\n", "additional properties 'gatway' not allowed"),
    (pools("{name: h100, nodeType: H100-80G, chunkSize: 0}"), "/engine/pools/0/chunkSize': minimum: got 0, want 1"),
    (pools(H100.replace("8192", '"8k"') + "}"), "/engine/pools/0/chunkSize': got string, want integer"),
    (pools("{name: mi300x, nodeType: MI300X, chunkSize: 4096}"), "missing property 'maxChunkPerGpu'"),
    (pools(H100 + ", gpusPerReplica: 0}"), "/engine/pools/0/gpusPerReplica': minimum: got 0, want 1"),
    (pools(H100 + ", targetQPSPerReplica: 0}"), "/engine/pools/0/targetQPSPerReplica': exclusiveMinimum"),
    (pools("{name: H100_Pool, nodeType: H100-80G, chunkSize: 8192}"), "/engine/pools/0/name': 'H100_Pool' does not match"),
    (pools(H100 + ", tolerations: [{key: nvidia.com/gpu, operator: Maybe}]}"), "/engine/pools/0/tolerations/0/operator'"),
    ("redis:\n  external:\n    url: mysql://db:3306\n", "/redis/external/url': 'mysql://db:3306' does not match"),
    ("gateway:\n  service:\n    type: Public\n", "value must be one of 'ClusterIP', 'NodePort', 'LoadBalancer'"),
    ("gateway:\n  ingress:\n    enabled: true\n", "/gateway/ingress/host': minLength"),
    ("gateway:\n  apiKeys:\n    entries: [{sha256: k25-plain-text-key, tenant: acme}]\n",
     "/gateway/apiKeys/entries/0/sha256': 'k25-plain-text-key' does not match"),
    ("gateway:\n  port: 80\n", "/gateway/port': minimum: got 80, want 1,024"),
    ("image:\n  tag: 1.2\n", "/image/tag': got number, want string"),
    ("tracing:\n  otlpEndpoint: collector:4317\n", "/tracing/otlpEndpoint': 'collector:4317' does not match"),
    # what a schema cannot say, the chart's templates check
    (pools(H100 + ", minReplicas: 5, maxReplicas: 2}"), "engine.pools[0] (h100): minReplicas (5) must not exceed maxReplicas (2)"),
    (pools(H100 + "}", "{name: h100, nodeType: H200, chunkSize: 4096}"), 'the pool name "h100" is used twice'),
    ("models:\n  persistence:\n    enabled: false\n",
     "model /models/SmolLM2-135M-Instruct.Q4_1.gguf is a path on the models volume, but models.persistence.enabled is false"),
    ("gateway:\n  autoscaling:\n    enabled: true\n    minReplicas: 6\n    maxReplicas: 3\n",
     "gateway.autoscaling: minReplicas (6) must not exceed maxReplicas (3)"),
])
def test_wrong_values_are_refused_with_a_readable_message(values, message, tmp_path):
    assert message in render_error(values, tmp_path)


def test_an_unprofiled_node_type_with_max_chunk_per_gpu_is_fine(tmp_path):
    path = tmp_path / "values.yaml"
    path.write_text(pools("{name: mi300x, nodeType: MI300X, chunkSize: 4096, maxChunkPerGpu: 6}"))
    result = helm("template", RELEASE, str(CHART), "--values", str(path))
    assert result.returncode == 0, result.stderr


def test_a_pool_takes_exactly_the_crds_spec_fields_with_the_same_bounds():
    pool = SCHEMA["definitions"]["pool"]["properties"]
    assert set(pool) - {"name"} == set(CRD_SPEC["properties"])
    for field, crd_field in CRD_SPEC["properties"].items():
        ours = pool[field]
        if "$ref" in ours:
            ours = SCHEMA["definitions"][ours["$ref"].rsplit("/", 1)[1]]
        assert ours.get("type") == crd_field.get("type"), field
        if crd_field.get("exclusiveMinimum"):
            assert ours["exclusiveMinimum"] == crd_field["minimum"], field
        elif "minimum" in crd_field:
            assert ours["minimum"] == crd_field["minimum"], field
        if crd_field.get("type") == "array":
            assert ours["items"]["properties"].keys() == crd_field["items"]["properties"].keys(), field
            for name, sub in crd_field["items"]["properties"].items():
                assert ours["items"]["properties"][name].get("enum") == sub.get("enum"), (field, name)
    assert set(SCHEMA["definitions"]["pool"]["required"]) - {"name"} <= set(CRD_SPEC["required"])


def test_the_schema_repeats_the_crds_node_type_rules():
    [profiled_rule] = [r["rule"] for r in CRD_SPEC["x-kubernetes-validations"] if "maxChunkPerGpu" in r["rule"]]
    known = SCHEMA["definitions"]["pool"]["allOf"][0]["if"]["properties"]["nodeType"]["not"]["enum"]
    assert all(f"'{node_type}'" in profiled_rule for node_type in known)
    assert profiled_rule.count("'") == 2 * len(known)


def value_paths(node: dict, prefix: str = ""):
    """Every settable value's dotted path; maps that are free-form (resources, selectors) count as one."""
    free_form = {"resources", "pools", "podSecurityContext", "containerSecurityContext", "metricsFrom", "annotations",
                 "labels", "nodeSelector", "tolerations", "accessModes", "imagePullSecrets", "entries"}
    for key, value in node.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value and key not in free_form:
            yield from value_paths(value, path)
        else:
            yield path


def test_the_chart_readme_documents_every_value():
    readme = (CHART / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("| `")]
    documented = set()
    for row in rows:
        names = re.findall(r"`([\w.]+)`", row.split("|")[1])
        parent = names[0].rsplit(".", 1)[0]
        documented |= {parent + name if name.startswith(".") else name for name in names}
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert sorted(set(value_paths(values)) - documented) == []
