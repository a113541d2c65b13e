from k25.cli import build_parser
from operators.deployment import build_deployment, deployment_name, engine_args, models_claim_name, pod_selector
from operators.pool_spec import parse_pool_spec

POOL = {"apiVersion": "k25.io/v1alpha1", "kind": "EnginePool",
        "metadata": {"name": "long", "namespace": "serving", "uid": "u-1"}}


def manifest(operator_env=None, **spec):
    parsed = parse_pool_spec({"nodeType": "A100-80G", "model": "/models/m.gguf", "chunkSize": 4096, **spec})
    return build_deployment(POOL, parsed, 3, "redis://redis:6379/0", "prod", operator_env or {})


def mounts_and_claims(pod: dict) -> dict[str, str]:
    """mount path -> the claim behind it (every one must be read-only, volume and mount)."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    found = {}
    for mount in pod["containers"][0]["volumeMounts"]:
        claim = volumes[mount["name"]].get("persistentVolumeClaim")
        if claim is not None:
            assert mount["readOnly"] is True and claim["readOnly"] is True, mount
            found[mount["mountPath"]] = claim["claimName"]
    return found


def test_the_deployment_is_named_and_labelled_for_its_pool():
    deployment = manifest()
    assert deployment["metadata"]["name"] == deployment_name("long") == "long-engine"
    assert deployment["metadata"]["namespace"] == "serving"
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["selector"] == {"matchLabels": {"k25.io/pool": "long"}}
    assert deployment["spec"]["template"]["metadata"]["labels"]["k25.io/pool"] == "long"
    assert deployment["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/instance"] == "prod"
    assert pod_selector("long") == "k25.io/pool=long"


def test_the_engine_gets_chunk_size_max_chunk_node_type_pool_redis_release_and_its_pod_ip():
    container = manifest()["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["k25", "engine", "--model", "/models/m.gguf", "--chunk-size", "4096",
                                 "--max-chunk-per-gpu", "4", "--node-type", "A100-80G", "--pool", "long",
                                 "--zmq-port", "5555", "--metrics-port", "9100", "--redis-url", "redis://redis:6379/0",
                                 "--release", "prod", "--advertise-host", "$(POD_IP)", "--device", "cuda"]
    assert {"name": "K25_RELEASE", "value": "prod"} in container["env"]
    # the kubelet expands $(POD_IP) only from a variable defined in the container's env
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in container["env"]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "1"}}


def test_a_profiled_node_type_leaves_max_chunk_to_the_engine():
    args = engine_args(parse_pool_spec({"nodeType": "H200", "model": "m", "chunkSize": 64}), "p", "redis://r", "k25")
    assert "--max-chunk-per-gpu" not in args


def test_a_cpu_pool_asks_for_no_gpu_tolerates_no_gpu_taint_and_runs_on_the_cpu():
    pod = manifest(nodeType="CPU", maxChunkPerGpu=1)["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"] == {}
    assert pod["tolerations"] == []
    assert pod["containers"][0]["args"][-2:] == ["--device", "cpu"]


def test_a_model_path_under_models_mounts_the_releases_models_claim_read_only():
    pod = manifest()["spec"]["template"]["spec"]
    [claim] = [v["persistentVolumeClaim"] for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert claim == {"claimName": models_claim_name("prod"), "readOnly": True} and claim["claimName"] == "prod-models"
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["/models"]["readOnly"] is True
    assert "/tmp" in mounts  # the one writable place under a read-only root


def test_a_model_by_name_needs_no_claim():
    pod = manifest(model="tiny-random")["spec"]["template"]["spec"]
    assert [v["name"] for v in pod["volumes"]] == ["tmp"]
    assert [m["mountPath"] for m in pod["containers"][0]["volumeMounts"]] == ["/tmp"]


def test_the_engine_runs_as_non_root_without_privileges_on_a_read_only_root():
    pod = manifest()["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    container = pod["containers"][0]["securityContext"]
    assert container == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                         "capabilities": {"drop": ["ALL"]}}


def test_node_selector_and_gpus_per_replica_reach_the_pod():
    pod = manifest(nodeSelector={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}, gpusPerReplica=2)
    spec = pod["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"


def test_the_pool_owns_the_deployment():
    assert manifest()["metadata"]["ownerReferences"] == [
        {"apiVersion": "k25.io/v1alpha1", "kind": "EnginePool", "name": "long", "uid": "u-1",
         "controller": True, "blockOwnerDeletion": True}]


def test_without_lora_the_engine_gets_no_adapter_flags_and_no_adapter_mount():
    pod = manifest()["spec"]["template"]["spec"]
    assert not [a for a in pod["containers"][0]["args"] if "lora" in a or "adapter" in a]
    assert mounts_and_claims(pod) == {"/models": "prod-models"}


def test_a_lora_pool_runs_the_engine_with_its_adapter_flags_as_the_cli_reads_them():
    lora = {"maxLoras": 4, "maxCpuLoras": 12, "maxLoraRank": 32, "kernel": "triton", "adapterRoot": "/srv/adapters"}
    args = manifest(lora=lora)["spec"]["template"]["spec"]["containers"][0]["args"]
    parsed = build_parser().parse_args(args[1:])
    assert (parsed.max_loras, parsed.max_cpu_loras, parsed.max_lora_rank, parsed.lora_kernel, parsed.adapter_root) == (
        4, 12, 32, "triton", "/srv/adapters")
    assert parsed.redis_url == "redis://redis:6379/0"  # with Redis, the engine follows the rollout state
    defaults = build_parser().parse_args(manifest(lora={"maxLoras": 2})["spec"]["template"]["spec"]["containers"][0]["args"][1:])
    assert (defaults.max_loras, defaults.max_cpu_loras, defaults.adapter_root) == (2, 8, "/adapters")


def test_adapters_come_from_the_models_claim_by_default_mounted_read_only_at_the_adapter_root():
    pod = manifest(lora={"maxLoras": 2})["spec"]["template"]["spec"]
    assert mounts_and_claims(pod) == {"/models": "prod-models", "/adapters": "prod-models"}
    assert [v["name"] for v in pod["volumes"]] == ["tmp", "models"]  # one volume, mounted twice
    by_name = manifest(model="tiny-random", lora={"maxLoras": 2})["spec"]["template"]["spec"]
    assert mounts_and_claims(by_name) == {"/adapters": "prod-models"}


def test_adapters_from_their_own_claim():
    pod = manifest(lora={"maxLoras": 2, "claimName": "lora-store", "adapterRoot": "/lora"})["spec"]["template"]["spec"]
    assert mounts_and_claims(pod) == {"/models": "prod-models", "/lora": "lora-store"}
    assert "/tmp" in {m["mountPath"] for m in pod["containers"][0]["volumeMounts"] if not m.get("readOnly")}


def test_the_engines_get_the_operators_otlp_endpoint_and_nothing_else_of_its_environment():
    operator_env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_EXPORTER_OTLP_HEADERS": "api-key=secret",
                    "KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOME": "/home/k25"}
    env = manifest(operator_env=operator_env)["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [e["name"] for e in env] == ["K25_RELEASE", "POD_IP", "OTEL_EXPORTER_OTLP_ENDPOINT"]
    assert env[-1] == {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://collector:4318"}
    traces_only = manifest(operator_env={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})
    assert traces_only["spec"]["template"]["spec"]["containers"][0]["env"][-1]["value"] == "http://c:4318/v1/traces"
    untraced = manifest(operator_env={"OTEL_EXPORTER_OTLP_ENDPOINT": ""})["spec"]["template"]["spec"]["containers"][0]
    assert [e["name"] for e in untraced["env"]] == ["K25_RELEASE", "POD_IP"]


def test_without_compute_settings_the_engine_takes_its_own_defaults():
    args = manifest()["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not {"--dtype", "--max-num-batched-tokens", "--max-num-seqs", "--gpu-memory-utilization"} & set(args)


def test_the_compute_settings_the_pool_sets_reach_the_engine_as_the_cli_reads_them():
    args = manifest(dtype="bfloat16", maxNumBatchedTokens=2048, maxNumSeqs=256,
                    gpuMemoryUtilization=0.92)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--dtype"):args.index("--dtype") + 8] == [
        "--dtype", "bfloat16", "--max-num-batched-tokens", "2048", "--max-num-seqs", "256",
        "--gpu-memory-utilization", "0.92"]
    parsed = build_parser().parse_args(args[1:])
    assert (parsed.dtype, parsed.max_num_batched_tokens, parsed.max_num_seqs, parsed.gpu_memory_utilization) == (
        "bfloat16", 2048, 256, 0.92)
    # each one alone: only that flag, the rest the engine's defaults
    engine = build_parser().parse_args(["engine"])
    only = build_parser().parse_args(manifest(maxNumSeqs=8)["spec"]["template"]["spec"]["containers"][0]["args"][1:])
    assert (only.dtype, only.max_num_batched_tokens, only.max_num_seqs, only.gpu_memory_utilization) == (
        engine.dtype, engine.max_num_batched_tokens, 8, engine.gpu_memory_utilization)


def test_prefix_caching_is_on_unless_the_pool_turns_it_off():
    on = build_parser().parse_args(manifest()["spec"]["template"]["spec"]["containers"][0]["args"][1:])
    off = build_parser().parse_args(manifest(prefixCaching=False)["spec"]["template"]["spec"]["containers"][0]["args"][1:])
    assert (on.prefix_caching, off.prefix_caching) == (True, False)


def test_a_cpu_pool_gets_its_dtype_on_the_cpu():
    args = manifest(nodeType="CPU", maxChunkPerGpu=1, dtype="float32")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-4:] == ["--device", "cpu", "--dtype", "float32"]
