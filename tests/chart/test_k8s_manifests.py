"""The CRD, examples and RBAC as files: the schema and its CEL rules reject bad specs,
the examples are valid pools, and the RBAC grants what the operator calls.

No API server runs here: tests/crd_schema.py checks a pool as one would (the schema by
`jsonschema`, the CEL rules by cel-python, on the spec with the schema's defaults)."""


import pytest
import yaml

from k25.cli import build_parser
from operators.config import RELEASE_LABEL
from operators.pool_spec import MAX_CHUNK_PER_GPU, parse_pool_spec
from operators.workload import DEPLOYMENT, LEADER_WORKER_SET
from tests.helpers.crd_schema import custom_resource_errors, with_defaults
from tests.helpers.paths import CRDS, K8S

K8S = K8S
CRD = yaml.safe_load((CRDS / "enginepool.yaml").read_text())
VERSION = CRD["spec"]["versions"][0]
SPEC_SCHEMA = VERSION["schema"]["openAPIV3Schema"]["properties"]["spec"]
EXAMPLES = sorted((K8S / "examples").glob("enginepool-*.yaml"))
VALID = {"nodeType": "H100-80G", "model": "m", "chunkSize": 512}


def api_server_accepts(spec: dict) -> list[str]:
    """What the API server would answer: [] or the reasons for refusing."""
    pool = {"apiVersion": "k25.io/v1alpha1", "kind": "EnginePool", "metadata": {"name": "p"}, "spec": spec}
    return custom_resource_errors(pool, CRD)


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
    # and with -o wide the dtype a pool sets (blank: the engine's default for its device)
    [dtype] = [c for c in VERSION["additionalPrinterColumns"] if c["name"] == "DType"]
    assert (dtype["jsonPath"], dtype["priority"]) == (".spec.dtype", 1)


def test_a_minimal_spec_is_accepted_with_the_documented_defaults():
    assert api_server_accepts(VALID) == []
    spec = with_defaults(SPEC_SCHEMA, VALID)
    assert (spec["minReplicas"], spec["maxReplicas"], spec["targetQPSPerReplica"]) == (1, 4, 80)
    assert (spec["scaleUpStabilizationSeconds"], spec["scaleDownStabilizationSeconds"]) == (0, 300)


def test_gpus_per_replica_defaults_by_node_type_after_the_api_server_stored_it():
    """No schema default: a CPU pool applied without gpusPerReplica must not ask for a GPU."""
    cpu = {"nodeType": "CPU", "model": "tiny-random", "chunkSize": 256}
    for spec, gpus in ((cpu, 0), (VALID, 1)):
        assert api_server_accepts(spec) == []
        assert parse_pool_spec(with_defaults(SPEC_SCHEMA, spec)).gpus_per_replica == gpus


@pytest.mark.parametrize("bad, reason", [
    ({"minReplicas": -1}, "less than the minimum of 0"),
    ({"maxReplicas": 0}, "less than the minimum of 1"),
    ({"replicas": -2}, "less than the minimum of 0"),
    ({"targetQPSPerReplica": 0}, "less than or equal to the minimum of 0"),
    ({"chunkSize": 0}, "less than the minimum of 1"),
    ({"minReplicas": 5, "maxReplicas": 2}, "minReplicas must not exceed maxReplicas"),
    ({"nodeType": "MI300X"}, "maxChunkPerGpu is required"),
    ({"nodeType": "H100-80G", "gpusPerReplica": 0}, "gpusPerReplica of at least 1"),
    ({"tolerations": [{"key": "nvidia.com/gpu", "operator": "Maybe"}]}, "not one of"),
    ({"model": ""}, "should be non-empty"),
    ({"lora": {}}, "'maxLoras' is a required property"),
    ({"lora": {"maxLoras": 0}}, "less than the minimum of 1"),
    ({"lora": {"maxLoras": 16}}, "lora.maxCpuLoras must be at least lora.maxLoras"),  # the default 8
    ({"lora": {"maxLoras": 2, "maxLoraRank": 0}}, "less than the minimum of 1"),
    ({"lora": {"maxLoras": 2, "kernel": "cuda"}}, "is not one of ['torch', 'triton']"),
    ({"lora": {"maxLoras": 2, "adapterRoot": "adapters"}}, "does not match"),
    ({"lora": {"maxLoras": 2, "adapterRoot": "/adapters/../etc"}}, "does not match"),
    ({"lora": {"maxLoras": 2, "adapterRoot": "/tmp/adapters"}}, "must not be /tmp, /models or under them"),
    ({"lora": {"maxLoras": 2, "adapterRoot": "/models"}}, "must not be /tmp, /models or under them"),
    ({"lora": {"maxLoras": 2, "claimName": "Adapters_PVC"}}, "does not match"),
    ({"nodeType": "CPU", "gpusPerReplica": 0, "lora": {"maxLoras": 2, "kernel": "triton"}},
     "lora.kernel triton needs a GPU"),
    ({"dtype": "fp16"}, "is not one of ['auto', 'float32', 'bfloat16', 'float16']"),
    ({"maxNumBatchedTokens": 0}, "less than the minimum of 1"),
    ({"maxNumSeqs": 0}, "less than the minimum of 1"),
    ({"maxNumSeqs": "64"}, "is not of type 'integer'"),
    ({"gpuMemoryUtilization": 0}, "less than or equal to the minimum of 0"),
    ({"gpuMemoryUtilization": 1.1}, "greater than the maximum of 1"),
    ({"overtakeLimitS": -1}, "less than the minimum of 0"),
    ({"overtakeLimitS": "5"}, "is not of type 'number'"),
    ({"nodeType": "CPU", "dtype": "float16"}, "dtype float16 needs a GPU"),
    ({"nodeType": "CPU", "gpusPerReplica": 0, "dtype": "float16"}, "dtype float16 needs a GPU"),
    ({"nodeType": "L4", "maxChunkPerGpu": 2, "gpusPerReplica": 0, "dtype": "float16"}, "dtype float16 needs a GPU"),
    ({"drainTimeoutSeconds": -1}, "less than the minimum of 0"),
    ({"drainTimeoutSeconds": 3601}, "greater than the maximum of 3600"),
    ({"modelSha256": {"model.safetensors": "ABC"}}, "does not match"),
    ({"modelSha256": {"model.safetensors": "A" * 64}}, "does not match"),  # lowercase, as sha256sum prints it
    ({"modelSha256": {"/models/m.gguf": "a" * 64}}, "modelSha256 keys are model files relative to the model's folder"),
    ({"modelSha256": {"a=b": "a" * 64}}, "without '='"),
])
def test_bad_specs_are_refused(bad, reason):
    errors = api_server_accepts({**VALID, **bad})
    assert any(reason in error for error in errors), errors
    with pytest.raises(ValueError):  # and the operator refuses them too, on any server
        parse_pool_spec({**VALID, **bad})


def test_lora_is_off_unless_given_and_fills_in_the_engines_defaults():
    assert "lora" not in with_defaults(SPEC_SCHEMA, VALID) and parse_pool_spec(VALID).lora is None
    spec = {**VALID, "lora": {"maxLoras": 4, "adapterRoot": "/models-adapters"}}
    assert api_server_accepts(spec) == []
    assert with_defaults(SPEC_SCHEMA, spec)["lora"] == {"maxLoras": 4, "maxCpuLoras": 8, "maxLoraRank": 64,
                                                         "kernel": "torch", "adapterRoot": "/models-adapters"}
    engine = build_parser().parse_args(["engine"])  # `k25 engine`'s own defaults
    lora = parse_pool_spec(spec).lora
    assert (lora.max_cpu_loras, lora.max_lora_rank, lora.kernel) == (
        engine.max_cpu_loras, engine.max_lora_rank, engine.lora_kernel)


def test_compute_settings_are_optional_and_reach_the_operator_as_written():
    assert not {"dtype", "maxNumBatchedTokens", "maxNumSeqs", "gpuMemoryUtilization", "overtakeLimitS"} & set(
        with_defaults(SPEC_SCHEMA, VALID))  # absent: the engine's defaults, no schema default
    for limit in (0, 2.5):  # 0: first come, first served
        assert api_server_accepts({**VALID, "overtakeLimitS": limit}) == []
        assert parse_pool_spec(with_defaults(SPEC_SCHEMA, {**VALID, "overtakeLimitS": limit})).engine_settings["overtake_limit_s"] == limit
    settings = {"dtype": "bfloat16", "maxNumBatchedTokens": 2048, "maxNumSeqs": 256, "gpuMemoryUtilization": 1}
    assert api_server_accepts({**VALID, **settings}) == []
    spec = parse_pool_spec(with_defaults(SPEC_SCHEMA, {**VALID, **settings}))
    assert spec.engine_settings == {"dtype": "bfloat16", "max_num_batched_tokens": 2048, "max_num_seqs": 256,
                                    "gpu_memory_utilization": 1.0, "prefix_caching": True, "cuda_graphs": True,
                                    "expert_parallel": False}
    for dtype in ("auto", "float32", "bfloat16"):  # every dtype but float16 runs on a CPU
        cpu = {"nodeType": "CPU", "model": "tiny-random", "chunkSize": 256, "dtype": dtype}
        assert api_server_accepts(cpu) == [] and parse_pool_spec(cpu).engine_settings["dtype"] == dtype
    # float16 with a GPU, whatever the node type is called
    assert api_server_accepts({**VALID, "nodeType": "CPU", "gpusPerReplica": 1, "dtype": "float16"}) == []
    assert api_server_accepts({**VALID, "dtype": "float16"}) == []


def test_cuda_graphs_default_to_on_and_a_pool_may_turn_them_off():
    assert parse_pool_spec(with_defaults(SPEC_SCHEMA, VALID)).engine_settings["cuda_graphs"] is True
    assert api_server_accepts({**VALID, "cudaGraphs": False}) == []
    assert parse_pool_spec(with_defaults(SPEC_SCHEMA, {**VALID, "cudaGraphs": False})).engine_settings["cuda_graphs"] is False
    assert api_server_accepts({**VALID, "cudaGraphs": "off"}) != []


def test_drain_timeout_defaults_to_the_gateways_request_deadline_and_model_digests_are_optional():
    spec = with_defaults(SPEC_SCHEMA, VALID)
    deadline = build_parser().parse_args(["gateway"]).request_timeout_s
    assert spec["drainTimeoutSeconds"] == deadline and "modelSha256" not in spec
    assert parse_pool_spec(VALID).drain_timeout_s == parse_pool_spec(spec).drain_timeout_s == deadline
    digests = {"model-00001-of-00002.safetensors": "0" * 64, "sub/config.json": "f" * 64}
    assert api_server_accepts({**VALID, "drainTimeoutSeconds": 0, "modelSha256": digests}) == []
    assert parse_pool_spec({**VALID, "modelSha256": digests}).model_sha256 == digests


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


@pytest.mark.parametrize("path", sorted((K8S / "examples").glob("*.yaml")), ids=lambda p: p.stem)
def test_examples_are_labelled_for_the_operator_of_release_k25(path):
    assert yaml.safe_load(path.read_text())["metadata"]["labels"][RELEASE_LABEL] == "k25"  # k25 operator's default


def test_the_examples_cover_the_three_node_types():
    types_ = {yaml.safe_load(p.read_text())["spec"]["nodeType"]: yaml.safe_load(p.read_text())["spec"]["maxChunkPerGpu"]
              for p in EXAMPLES}
    assert types_ == {"A100-40G": 2, "A100-80G": 4, "H100-80G": 8}


def test_the_rollout_examples_pools_are_example_pools_that_load_adapters():
    pools = {yaml.safe_load(p.read_text())["metadata"]["name"]: parse_pool_spec(yaml.safe_load(p.read_text())["spec"])
             for p in EXAMPLES}
    rollouts = [yaml.safe_load(p.read_text()) for p in sorted((K8S / "examples").glob("adapterrollout-*.yaml"))]
    assert rollouts
    for rollout in rollouts:
        assert pools[rollout["spec"]["pool"]].lora is not None, rollout["metadata"]["name"]


def test_rbac_grants_what_the_operator_calls_and_nothing_broad():
    documents = list(yaml.safe_load_all((K8S / "rbac" / "operator.yaml").read_text()))
    rules = next(d for d in documents if d["kind"] == "ClusterRole")["rules"]
    granted = {(group, resource, verb) for rule in rules for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    used = {("k25.io", "enginepools", "watch"), ("k25.io", "enginepools", "patch"),
            ("k25.io", "enginepools/status", "patch"), ("k25.io", "adapterrollouts", "watch"),
            ("k25.io", "adapterrollouts", "patch"), ("k25.io", "adapterrollouts/status", "patch"),
            ("apps", "deployments", "create"),
            ("apps", "deployments", "get"), ("apps", "deployments", "list"), ("apps", "deployments", "patch"),
            ("apps", "deployments", "delete"),
            ("apps", "deployments/scale", "patch"), ("", "pods", "list"), ("kopf.dev", "clusterkopfpeerings", "patch")}
    # the same calls on a pool's other kind of workload (operators/kube.py takes either)
    used |= {(LEADER_WORKER_SET.group, resource.replace("deployments", LEADER_WORKER_SET.plural), verb)
             for group, resource, verb in used if group == DEPLOYMENT.group}
    assert used <= granted
    assert not any("*" in (rule["verbs"] + rule["resources"] + rule["apiGroups"]) for rule in rules)
    assert not any(resource == "secrets" for _, resource, _ in granted)
