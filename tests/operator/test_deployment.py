from k25.cli import build_parser
from k25.commands.engine import invalid_flags
from operators.config import OperatorConfig
from operators.deployment import (
    build_deployment,
    engine_args,
    models_claim_name,
    owned_by,
    owner_reference,
    pod_selector,
    workload_name,
)
from operators.pool_spec import parse_pool_spec

POOL = {"apiVersion": "k25.io/v1alpha1", "kind": "EnginePool",
        "metadata": {"name": "long", "namespace": "serving", "uid": "u-1"}}


CONFIG = OperatorConfig(release="prod", redis_url="redis://:secret@redis:6379/0", redis_secret="prod-k25-redis")


def manifest(operator_env=None, config=CONFIG, **spec):
    parsed = parse_pool_spec({"nodeType": "A100-80G", "model": "/models/m.gguf", "chunkSize": 4096, **spec})
    return build_deployment(POOL, parsed, 3, config, operator_env or {})


def engine_container(**spec) -> dict:
    return manifest(**spec)["spec"]["template"]["spec"]["containers"][0]


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
    assert deployment["metadata"]["name"] == workload_name("long") == "long-engine"
    assert deployment["metadata"]["namespace"] == "serving"
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["selector"] == {"matchLabels": {"k25.io/pool": "long"}}
    assert deployment["spec"]["template"]["metadata"]["labels"]["k25.io/pool"] == "long"
    assert deployment["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/instance"] == "prod"
    assert pod_selector("long") == "k25.io/pool=long"


def test_the_engine_gets_chunk_size_max_chunk_node_type_pool_release_and_listens_on_its_pod_ip():
    container = engine_container()
    assert container["args"] == ["k25", "engine", "--model", "/models/m.gguf", "--chunk-size", "4096",
                                 "--max-chunk-per-gpu", "4", "--node-type", "A100-80G", "--pool", "long",
                                 "--zmq-port", "5555", "--metrics-port", "9100", "--release", "prod",
                                 "--bind-address", "$(POD_IP)", "--advertise-host", "$(POD_IP)", "--device", "cuda",
                                 "--drain-timeout-s", "600"]
    assert {"name": "K25_RELEASE", "value": "prod"} in container["env"]
    # the kubelet expands $(POD_IP) only from a variable defined in the container's env
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in container["env"]
    assert container["resources"] == {"requests": {"cpu": "1", "memory": "8Gi"}, "limits": {"nvidia.com/gpu": "1"}}


def test_the_redis_url_and_its_password_come_from_the_releases_secret_never_in_the_pod_spec():
    container = engine_container()
    assert {"name": "K25_REDIS_URL", "valueFrom": {"secretKeyRef": {"name": "prod-k25-redis", "key": "redis-url"}}} \
        in container["env"]
    assert "secret" not in str(manifest()).replace("secretKeyRef", "").replace("prod-k25-redis", "")
    # an operator without a Secret hands on its own URL, which then carries no password
    plain = OperatorConfig(release="prod", redis_url="redis://redis:6379/0")
    assert {"name": "K25_REDIS_URL", "value": "redis://redis:6379/0"} in engine_container(config=plain)["env"]


def test_the_curve_key_comes_from_the_releases_transport_secret_and_without_one_there_is_none():
    with_curve = OperatorConfig(release="prod", redis_url="redis://redis:6379/0", curve_secret="prod-k25-transport")
    assert {"name": "K25_CURVE_SECRET_KEY",
            "valueFrom": {"secretKeyRef": {"name": "prod-k25-transport", "key": "curve-secret-key"}}} \
        in engine_container(config=with_curve)["env"]
    assert "K25_CURVE_SECRET_KEY" not in {e["name"] for e in engine_container()["env"]}  # CURVE off


def test_engines_read_a_rotations_second_key_when_the_transport_secret_holds_one():
    with_curve = OperatorConfig(release="prod", redis_url="redis://redis:6379/0", curve_secret="prod-k25-transport")
    env = engine_container(config=with_curve)["env"]
    for name, key in (("K25_CURVE_SECRET_KEY_NEXT", "curve-secret-key-next"),
                      ("K25_CURVE_SECRET_KEY_PREVIOUS", "curve-secret-key-previous")):
        assert {"name": name, "valueFrom": {"secretKeyRef": {"name": "prod-k25-transport", "key": key,
                                                             "optional": True}}} in env
    assert not {"K25_CURVE_SECRET_KEY_NEXT", "K25_CURVE_SECRET_KEY_PREVIOUS"} & {e["name"] for e in engine_container()["env"]}


def test_the_grace_period_is_the_drain_timeout_plus_a_margin_and_there_is_no_pre_stop_hook():
    for drain, grace in ((None, 615), (0, 15), (120, 135)):  # by default the gateway's request deadline
        spec = {} if drain is None else {"drainTimeoutSeconds": drain}
        pod = manifest(**spec)["spec"]["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] == grace
        args = pod["containers"][0]["args"]
        assert build_parser().parse_args(args[1:]).drain_timeout_s == grace - 15
        assert "lifecycle" not in pod["containers"][0]  # gateways find engines in Redis, not through endpoints


def test_liveness_asks_the_engines_healthz_only_once_the_startup_probe_has_seen_it_loaded():
    container = engine_container()
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert {"name": "metrics", "containerPort": 9100} in container["ports"]
    assert "initialDelaySeconds" not in container["livenessProbe"]  # the startup probe holds it back
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # ten minutes to load a model


def test_model_digests_reach_the_engine_one_flag_per_file_as_the_cli_reads_them():
    digests = {"model-00002.safetensors": "b" * 64, "model-00001.safetensors": "a" * 64}
    args = engine_container(model="/models/llama", modelSha256=digests)["args"]
    assert [args[i + 1] for i, a in enumerate(args) if a == "--model-sha256"] == [
        "model-00001.safetensors=" + "a" * 64, "model-00002.safetensors=" + "b" * 64]
    parsed = build_parser().parse_args(args[1:])
    assert sorted(parsed.model_sha256) == sorted(f"{f}={d}" for f, d in digests.items())
    assert "--model-sha256" not in engine_container()["args"]


def test_the_engine_listens_on_the_pod_ip_as_the_cli_reads_it():
    args = [a.replace("$(POD_IP)", "10.1.2.3") for a in engine_container()["args"]]
    parsed = build_parser().parse_args(args[1:])
    assert (parsed.bind_address, parsed.advertise_host) == ("10.1.2.3", "10.1.2.3")


def test_a_profiled_node_type_leaves_max_chunk_to_the_engine():
    args = engine_args(parse_pool_spec({"nodeType": "H200", "model": "m", "chunkSize": 64}), "p", "k25")
    assert "--max-chunk-per-gpu" not in args


def test_max_chunk_auto_and_the_expected_chunks_reach_the_engine_as_the_cli_reads_them():
    args = engine_container(maxChunkPerGpu="auto", expectedChunksPerRequest=6)["args"]
    assert args[args.index("--max-chunk-per-gpu"):args.index("--max-chunk-per-gpu") + 4] == [
        "--max-chunk-per-gpu", "auto", "--expected-chunks-per-request", "6"]
    parsed = build_parser().parse_args(args[1:])
    assert (parsed.max_chunk_per_gpu, parsed.expected_chunks_per_request) == ("auto", 6)
    alone = build_parser().parse_args(engine_container(maxChunkPerGpu="auto")["args"][1:])
    assert (alone.max_chunk_per_gpu, alone.expected_chunks_per_request) == ("auto", 1)  # the engine's default
    assert build_parser().parse_args(engine_container(maxChunkPerGpu=6)["args"][1:]).max_chunk_per_gpu == 6


def test_a_cpu_pool_asks_for_no_gpu_tolerates_no_gpu_taint_and_runs_on_the_cpu():
    pod = manifest(nodeType="CPU", maxChunkPerGpu=1)["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "1", "memory": "8Gi"}}  # never BestEffort
    assert pod["tolerations"] == []
    args = pod["containers"][0]["args"]
    assert args[args.index("--device") + 1] == "cpu"


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
    pod = manifest(nodeSelector={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}, gpusPerReplica=2, backend="vllm")
    spec = pod["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"


def test_a_vllm_pool_over_several_gpus_runs_one_tensor_parallel_engine_as_the_cli_reads_it():
    container = engine_container(backend="vllm", gpusPerReplica=4)
    args = container["args"]
    assert args[args.index("--tensor-parallel-size"):args.index("--tensor-parallel-size") + 2] == [
        "--tensor-parallel-size", "4"]
    parsed = build_parser().parse_args(args[1:])
    assert (parsed.backend, parsed.tensor_parallel_size, parsed.device) == ("vllm", 4, "cuda")
    assert invalid_flags(parsed) == ""  # `k25 engine` takes it
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    # its workers share each step's inputs through a /dev/shm larger than a container's 64 MiB
    pod = manifest(backend="vllm", gpusPerReplica=4)["spec"]["template"]["spec"]
    assert {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}} in pod["volumes"]
    assert {"name": "shm", "mountPath": "/dev/shm"} in pod["containers"][0]["volumeMounts"]


def test_an_engine_on_one_gpu_gets_no_tensor_parallel_flag_and_no_shared_memory():
    for backend in ("k25", "vllm"):
        container = engine_container(backend=backend)
        assert "--tensor-parallel-size" not in container["args"]
        parsed = build_parser().parse_args(container["args"][1:])
        assert (parsed.backend, parsed.tensor_parallel_size) == (backend, 1)
        assert "/dev/shm" not in {m["mountPath"] for m in container["volumeMounts"]}


def test_pod_annotations_reach_the_pod_template_so_that_a_change_rolls_the_engines():
    deployment = manifest(podAnnotations={"checksum/secrets": "abc"})
    assert deployment["spec"]["template"]["metadata"]["annotations"] == {"checksum/secrets": "abc"}
    assert manifest()["spec"]["template"]["metadata"]["annotations"] == {}


def test_the_pool_owns_the_deployment():
    deployment = manifest()
    assert deployment["metadata"]["ownerReferences"] == [
        {"apiVersion": "k25.io/v1alpha1", "kind": "EnginePool", "name": "long", "uid": "u-1",
         "controller": True, "blockOwnerDeletion": True}]
    assert owned_by(deployment, "u-1")


def test_a_deployment_is_the_pools_only_when_an_owner_reference_has_the_pools_uid():
    earlier = {**owner_reference(POOL), "uid": "u-0"}  # an earlier pool of the same name
    other = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "x", "uid": "u-9"}
    assert not owned_by({"metadata": {}}, "u-1")
    assert not owned_by({"metadata": {"ownerReferences": None}}, "u-1")
    assert not owned_by({"metadata": {"ownerReferences": [earlier, other]}}, "u-1")
    assert owned_by({"metadata": {"ownerReferences": [other, owner_reference(POOL)]}}, "u-1")


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
    assert parsed.release == "prod"  # with Redis (K25_REDIS_URL), the engine follows the release's rollout state
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
    assert [e["name"] for e in env] == ["K25_RELEASE", "POD_IP", "K25_REDIS_URL", "OTEL_EXPORTER_OTLP_ENDPOINT"]
    assert env[-1] == {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://collector:4318"}
    traces_only = manifest(operator_env={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})
    assert traces_only["spec"]["template"]["spec"]["containers"][0]["env"][-1]["value"] == "http://c:4318/v1/traces"
    untraced = manifest(operator_env={"OTEL_EXPORTER_OTLP_ENDPOINT": ""})["spec"]["template"]["spec"]["containers"][0]
    assert [e["name"] for e in untraced["env"]] == ["K25_RELEASE", "POD_IP", "K25_REDIS_URL"]


def test_without_compute_settings_the_engine_takes_its_own_defaults():
    args = manifest()["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not {"--dtype", "--max-num-batched-tokens", "--max-num-seqs", "--gpu-memory-utilization",
                "--overtake-limit-s"} & set(args)


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


def test_the_overtake_limit_the_pool_sets_reaches_the_engine_and_0_is_passed_on():
    engine = build_parser().parse_args(["engine"])
    for limit in (2.5, 30, 0):
        args = manifest(overtakeLimitS=limit)["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--overtake-limit-s") + 1] == str(float(limit))
        parsed = build_parser().parse_args(args[1:])
        assert parsed.overtake_limit_s == limit
        # only that flag: the rest are the engine's defaults
        assert (parsed.dtype, parsed.max_num_seqs, parsed.gpu_memory_utilization) == (
            engine.dtype, engine.max_num_seqs, engine.gpu_memory_utilization)
    # absent: no flag, and the engine keeps its own default
    args = manifest()["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--overtake-limit-s" not in args
    assert build_parser().parse_args(args[1:]).overtake_limit_s == engine.overtake_limit_s == 5.0


def test_prefix_caching_is_on_unless_the_pool_turns_it_off():
    on = build_parser().parse_args(manifest()["spec"]["template"]["spec"]["containers"][0]["args"][1:])
    off = build_parser().parse_args(manifest(prefixCaching=False)["spec"]["template"]["spec"]["containers"][0]["args"][1:])
    assert (on.prefix_caching, off.prefix_caching) == (True, False)


def test_cuda_graphs_are_on_unless_the_pool_turns_them_off():
    on = build_parser().parse_args(manifest()["spec"]["template"]["spec"]["containers"][0]["args"][1:])
    off = build_parser().parse_args(manifest(cudaGraphs=False)["spec"]["template"]["spec"]["containers"][0]["args"][1:])
    assert (on.cuda_graphs, off.cuda_graphs) == (True, False)


def test_a_cpu_pool_gets_its_dtype_on_the_cpu():
    args = manifest(nodeType="CPU", maxChunkPerGpu=1, dtype="float32")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--device"):args.index("--device") + 2] == ["--device", "cpu"]
    assert args[-2:] == ["--dtype", "float32"]
