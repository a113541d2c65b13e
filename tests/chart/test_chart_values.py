"""values.schema.json and the chart's own checks refuse wrong values before anything is
installed, each with a message that names the value and says what is wanted; the pool
schema stays in step with the EnginePool CRD."""

import json
import re

import pytest
import yaml

from common.engine_settings import SETTINGS
from tests.helpers.crd_schema import as_json_schema
from tests.helpers.helm_chart import CHART, RELEASE, helm, render_error

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
CRD = yaml.safe_load((CHART / "crds" / "enginepool.yaml").read_text())
CRD_SPEC = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
CRD_LORA = CRD_SPEC["properties"]["lora"]["properties"]


def pools(*entries: str) -> str:
    return "engine:\n  pools:\n" + "".join(f"    - {entry}\n" for entry in entries)


H100 = "{name: h100, nodeType: H100-80G, chunkSize: 8192"
SHA = "0123456789abcdef" * 4


def rollouts(*entries: str, lora: int = 2) -> str:
    """A LoRA pool h100 and these adapterRollouts (flow-style YAML, `{...}` filled in)."""
    versions = f"stable: {{version: v1, source: a/v1, sha256: {SHA}}}, canary: {{version: v2, source: a/v2, sha256: {SHA}}}"
    return (pools(H100 + f", lora: {{maxLoras: {lora}}}}}") + "adapterRollouts:\n"
            + "".join(f"  - {entry.replace('...', versions)}\n" for entry in entries))


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
    ("gateway:\n  apiKeys:\n    tenants: {acme: {tokens_per_minute: 0}}\n",
     "/gateway/apiKeys/tenants/acme/tokens_per_minute': minimum: got 0, want 1"),
    ("gateway:\n  apiKeys:\n    tenants: {acme: {rpm: 10}}\n", "additional properties 'rpm' not allowed"),
    ("gateway:\n  port: 80\n", "/gateway/port': minimum: got 80, want 1,024"),
    ("image:\n  tag: 1.2\n", "/image/tag': got number, want string"),
    ("gateway:\n  image:\n    repository: k25 gateway\n", "/gateway/image/repository': 'k25 gateway' does not match"),
    ("operator:\n  image:\n    name: k25-operator\n", "additional properties 'name' not allowed"),
    ("tracing:\n  otlpEndpoint: collector:4317\n", "/tracing/otlpEndpoint': 'collector:4317' does not match"),
    ("operator:\n  watchNamespace: mine\n", "/operator/watchNamespace': value must be one of 'all', 'release'"),
    ("redis:\n  auth:\n    password: p@ss/word\n", "/redis/auth/password': 'p@ss/word' does not match"),
    ("redis:\n  external:\n    existingSecret: My_Secret\n", "/redis/external/existingSecret': 'My_Secret' does not match"),
    (pools(H100 + ", drainTimeoutSeconds: -5}"), "/engine/pools/0/drainTimeoutSeconds': minimum: got -5, want 0"),
    (pools(H100 + ", modelSha256: {m.gguf: abc}}"), "/engine/pools/0/modelSha256/m.gguf': 'abc' does not match"),
    (pools(H100 + ", modelSha256: {/models/m.gguf: " + SHA + "}}"), "invalid propertyName '/models/m.gguf'"),
    # what a schema cannot say, the chart's templates check
    ("redis:\n  external:\n    url: redis://r:6379/0\n    existingSecret: r\n",
     "redis.external: set url or existingSecret, not both"),
    ("redis:\n  external:\n    url: redis://r:6379/0\n  auth:\n    password: pw\n",
     "redis.auth is the password of the chart's own Redis, which does not run with redis.external set"),
    ("redis:\n  auth:\n    password: pw\n    existingSecret: r\n", "redis.auth: set password or existingSecret, not both"),
    (pools(H100 + ", minReplicas: 5, maxReplicas: 2}"), "engine.pools[0] (h100): minReplicas (5) must not exceed maxReplicas (2)"),
    (pools(H100 + "}", "{name: h100, nodeType: H200, chunkSize: 4096}"), 'the pool name "h100" is used twice'),
    ("models:\n  persistence:\n    enabled: false\n",
     "model /models/SmolLM2-135M-Instruct.Q4_1.gguf is a path on the models volume, but models.persistence.enabled is false"),
    ("gateway:\n  autoscaling:\n    enabled: true\n    minReplicas: 6\n    maxReplicas: 3\n",
     "gateway.autoscaling: minReplicas (6) must not exceed maxReplicas (3)"),
    ("gateway:\n  servedModelName: my model\n", "/gateway/servedModelName': 'my model' does not match"),
    # LoRA settings: the schema, then what it cannot say
    ("engine:\n  lora:\n    maxLoras: -1\n", "/engine/lora/maxLoras': minimum: got -1, want 0"),
    (pools(H100 + ", lora: {maxLoras: 2, kernel: cuda}}"), "/engine/pools/0/lora/kernel': value must be one of 'torch', 'triton'"),
    (pools(H100 + ", lora: {maxLoras: 2, adapterRoot: adapters}}"), "/engine/pools/0/lora/adapterRoot': 'adapters' does not match"),
    (pools(H100 + ", lora: {maxLoras: 2, lora: 3}}"), "additional properties 'lora' not allowed"),
    ("engine:\n  lora:\n    maxLoras: 16\n", "engine.pools[0] (a100-40g): lora.maxCpuLoras (8) must be at least lora.maxLoras (16)"),
    (pools(H100 + ", lora: {maxLoras: 2, adapterRoot: /models/lora}}"),
     "engine.pools[0] (h100): lora.adapterRoot /models/lora must not be /tmp, /models or under them"),
    ("model: tiny-random\nmodels:\n  persistence:\n    enabled: false\nengine:\n  lora:\n    maxLoras: 2\n",
     "engine.pools[0] (a100-40g): LoRA adapters come from the models claim unless lora.claimName names another"),
    (pools("{name: cpu, nodeType: CPU, chunkSize: 256, gpusPerReplica: 0, lora: {maxLoras: 1, kernel: triton}}"),
     "engine.pools[0] (cpu): lora.kernel triton needs a GPU"),
    # a CPU pool without gpusPerReplica gets none from the operator
    (pools("{name: cpu, nodeType: CPU, chunkSize: 256, lora: {maxLoras: 1, kernel: triton}}"),
     "engine.pools[0] (cpu): lora.kernel triton needs a GPU"),
    # compute settings: the schema (a pool's as the CRD's; engine's also take auto / 0), then float16 on a CPU
    (pools(H100 + ", dtype: fp16}"), "/engine/pools/0/dtype': value must be one of 'auto', 'float32', 'bfloat16', 'float16'"),
    (pools(H100 + ", maxNumBatchedTokens: 0}"), "/engine/pools/0/maxNumBatchedTokens': minimum: got 0, want 1"),
    (pools(H100 + ", maxNumSeqs: 0}"), "/engine/pools/0/maxNumSeqs': minimum: got 0, want 1"),
    (pools(H100 + ", gpuMemoryUtilization: 0}"), "/engine/pools/0/gpuMemoryUtilization': exclusiveMinimum"),
    (pools(H100 + ", gpuMemoryUtilization: 1.5}"), "/engine/pools/0/gpuMemoryUtilization': maximum: got 1.5, want 1"),
    ("engine:\n  dtype: half\n", "/engine/dtype': value must be one of 'auto', 'float32', 'bfloat16', 'float16'"),
    ("engine:\n  maxNumSeqs: 0\n", "/engine/maxNumSeqs': minimum: got 0, want 1"),
    ("engine:\n  maxNumBatchedTokens: 1.5\n", "/engine/maxNumBatchedTokens': got number, want null or integer"),
    ("engine:\n  gpuMemoryUtilization: 90\n", "/engine/gpuMemoryUtilization': maximum: got 90, want 1"),
    # overtakeLimitS: 0 is first come, first served (engine's null: the engine's default)
    (pools(H100 + ", overtakeLimitS: -1}"), "/engine/pools/0/overtakeLimitS': minimum: got -1, want 0"),
    (pools(H100 + ', overtakeLimitS: "5"}'), "/engine/pools/0/overtakeLimitS': got string, want number"),
    (pools(H100 + ", overtakeLimitS: null}"), "/engine/pools/0/overtakeLimitS': got null, want number"),
    ("engine:\n  overtakeLimitS: -0.5\n", "/engine/overtakeLimitS': minimum: got -0.5, want 0"),
    ("engine:\n  overtakeLimitS: 5s\n", "/engine/overtakeLimitS': got string, want null or number"),
    (pools("{name: cpu, nodeType: CPU, chunkSize: 256, gpusPerReplica: 0, dtype: float16}"),
     "engine.pools[0] (cpu): dtype float16 needs a GPU (gpusPerReplica is 0); on a CPU use float32, bfloat16 or auto"),
    ("engine:\n  dtype: float16\n  pools:\n    - " + H100 + "}\n    - {name: cpu, nodeType: CPU, chunkSize: 256}\n",
     "engine.pools[1] (cpu): dtype float16 needs a GPU"),
    # adapterRollouts: the schema, then the pools they name and the rules of the CRD
    (rollouts("{name: legal, pool: h100, stable: {version: v1, source: a/v1, sha256: abc}, canary: {version: v2, source: a/v2, sha256: abc}}"),
     "/adapterRollouts/0/stable/sha256': 'abc' does not match"),
    (rollouts("{name: legal, pool: h100, ..., interval: 600}"), "/adapterRollouts/0/interval': maximum: got 600, want 300"),
    (rollouts("{name: legal, pool: h100, ..., steps: [20, 50]}"), "adapterRollouts[0] (legal): steps must end at 100"),
    (rollouts("{name: legal, pool: h100, ..., steps: [50, 20, 100]}"), "adapterRollouts[0] (legal): steps must be increasing"),
    (rollouts("{name: legal, pool: h100, stable: {version: v1, source: a/v1, sha256: " + SHA + "}, "
              "canary: {version: v1, source: a/v1b, sha256: " + SHA + "}}"),
     "adapterRollouts[0] (legal): canary.version must differ from stable.version (v1)"),
    (rollouts("{name: legal, pool: a100, ...}"), 'adapterRollouts[0] (legal): pool "a100" is not in engine.pools (h100)'),
    (rollouts("{name: legal, pool: h100, ...}", lora=0), 'adapterRollouts[0] (legal): pool "h100" serves no adapters'),
    (rollouts("{name: legal, pool: h100, ...}", "{name: legal, adapter: other, pool: h100, ...}"),
     'adapterRollouts[1] (legal): the name "legal" is used twice'),
    (rollouts("{name: legal, pool: h100, ...}", "{name: legal-2, adapter: legal, pool: h100, ...}"),
     'adapterRollouts[1] (legal-2): the adapter "legal" has two rollouts'),
    (rollouts("{name: base, pool: h100, ...}"), 'adapterRollouts[0] (base): the adapter "base" has the base model\'s name'),
    ("gateway:\n  servedModelName: legal\n" + rollouts("{name: legal, pool: h100, ...}"),
     'adapterRollouts[0] (legal): the adapter "legal" has the base model\'s name'),
])
def test_wrong_values_are_refused_with_a_readable_message(values, message, tmp_path):
    assert message in render_error(values, tmp_path)


def test_an_unprofiled_node_type_with_max_chunk_per_gpu_is_fine(tmp_path):
    path = tmp_path / "values.yaml"
    path.write_text(pools("{name: mi300x, nodeType: MI300X, chunkSize: 4096, maxChunkPerGpu: 6}"))
    result = helm("template", RELEASE, str(CHART), "--values", str(path))
    assert result.returncode == 0, result.stderr


def resolved(schema: dict) -> dict:
    return SCHEMA["definitions"][schema["$ref"].rsplit("/", 1)[1]] if "$ref" in schema else schema


def bound_differences(ours: dict, crd: dict, path: str) -> list[str]:
    """Where a values-schema field takes other values than the CRD's (type, bounds, enum,
    pattern, object fields, list items), down to every nested field."""
    ours, crd = resolved(ours), as_json_schema(crd)
    differences = []
    for key in ("type", "anyOf", "minimum", "maximum", "exclusiveMinimum", "enum", "pattern", "minItems", "maxItems"):
        if key in crd and ours.get(key, crd["type"] if key == "type" and "enum" in ours else None) != crd[key]:
            differences.append(f"{path}: {key} {ours.get(key)!r} != {crd[key]!r}")
    if "properties" in crd:
        if set(ours.get("properties", {})) != set(crd["properties"]):
            differences.append(f"{path}: fields {sorted(ours.get('properties', {}))} != {sorted(crd['properties'])}")
        for name in set(ours.get("properties", {})) & set(crd["properties"]):
            differences += bound_differences(ours["properties"][name], crd["properties"][name], f"{path}.{name}")
    if "items" in crd:
        differences += bound_differences(ours["items"], crd["items"], f"{path}[]")
    return differences


def crd_spec(name: str) -> dict:
    crd = yaml.safe_load((CHART / "crds" / name).read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def test_float16_is_fine_on_a_gpu_pool_and_a_cpu_pool_may_say_auto_under_an_engine_wide_float16(tmp_path):
    path = tmp_path / "values.yaml"
    path.write_text("engine:\n  dtype: float16\n  pools:\n    - " + H100 + "}\n"
                    "    - {name: cpu, nodeType: CPU, chunkSize: 256, dtype: auto}\n")
    result = helm("template", RELEASE, str(CHART), "--values", str(path))
    assert result.returncode == 0, result.stderr


def test_a_pool_takes_exactly_the_crds_spec_fields_with_the_same_bounds():
    pool = SCHEMA["definitions"]["pool"]
    ours = {**pool, "properties": {k: v for k, v in pool["properties"].items() if k != "name"}}
    # in values, an empty claimName means the models claim and maxLoras 0 adapters off: the
    # chart then writes no claimName, or no spec.lora at all
    differences = bound_differences(ours, CRD_SPEC, "pool")
    assert [d for d in differences if not d.startswith("pool.lora.claimName: pattern")] == [
        "pool.lora.maxLoras: minimum 0 != 1"]
    claim_pattern = SCHEMA["definitions"]["lora"]["properties"]["claimName"]["pattern"]
    assert claim_pattern == "^(" + CRD_LORA["claimName"]["pattern"][1:-1] + ")?$"  # the CRD's, or empty
    assert set(pool["required"]) - {"name"} <= set(CRD_SPEC["required"])


def test_a_rollout_takes_exactly_the_crds_spec_fields_with_the_same_bounds():
    rollout = SCHEMA["definitions"]["adapterRollout"]
    spec = crd_spec("adapterrollout.yaml")
    ours = {**rollout, "properties": {k: v for k, v in rollout["properties"].items() if k != "name"}}
    assert bound_differences(ours, spec, "rollout") == []
    # adapter defaults to the rollout's name
    assert set(rollout["required"]) - {"name"} == set(spec["required"]) - {"adapter"}


def test_the_bound_comparison_can_fail():
    assert bound_differences({"type": "integer", "minimum": 2}, {"type": "integer", "minimum": 1}, "x") == [
        "x: minimum 2 != 1"]
    assert bound_differences({"type": "object", "properties": {"a": {"enum": ["p"]}}},
                             {"type": "object", "properties": {"a": {"type": "string", "enum": ["p", "q"]}}}, "x") == [
        "x.a: enum ['p'] != ['p', 'q']"]


def test_the_schema_repeats_the_crds_node_type_rules():
    [profiled_rule] = [r["rule"] for r in CRD_SPEC["x-kubernetes-validations"]
                       if r["message"].startswith("maxChunkPerGpu is required for a node type without a hardware profile")]
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
        names = re.findall(r"`([\w.<>]+)`", row.split("|")[1])
        parent = names[0].rsplit(".", 1)[0]
        documented |= {parent + name if name.startswith(".") else name for name in names}
    if "engine.<setting>" in documented:  # one row for them all: the reference pages list each
        documented |= {f"engine.{setting.field}" for setting in SETTINGS}
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert sorted(set(value_paths(values)) - documented) == []
