import pytest

from common.engine_settings import DTYPES
from k25.cli import build_parser
from operators.pool_spec import GPU_TAINT_TOLERATION, LoraSpec, PoolSpecError, parse_pool_spec

MINIMAL = {"nodeType": "A100-40G", "model": "m", "chunkSize": 1024}


def test_defaults_follow_the_node_type():
    spec = parse_pool_spec(MINIMAL)
    assert spec.max_chunk_per_gpu == 2
    assert (spec.gpus_per_replica, spec.tolerations) == (1, (GPU_TAINT_TOLERATION,))
    assert (spec.min_replicas, spec.max_replicas, spec.target_qps_per_replica) == (1, 4, 80.0)
    assert (spec.scale_up_window_s, spec.scale_down_window_s) == (0, 300)
    assert parse_pool_spec({**MINIMAL, "nodeType": "A100-80G"}).max_chunk_per_gpu == 4
    assert parse_pool_spec({**MINIMAL, "nodeType": "H100-80G"}).max_chunk_per_gpu == 8


def test_profiled_node_types_leave_max_chunk_to_the_engine():
    assert parse_pool_spec({**MINIMAL, "nodeType": "H200"}).max_chunk_per_gpu is None
    cpu = parse_pool_spec({**MINIMAL, "nodeType": "CPU"})
    assert (cpu.max_chunk_per_gpu, cpu.gpus_per_replica, cpu.tolerations) == (None, 0, ())


def test_an_explicit_value_wins_over_the_node_type_default():
    assert parse_pool_spec({**MINIMAL, "maxChunkPerGpu": 3}).max_chunk_per_gpu == 3


def test_auto_with_the_expected_chunks_per_request():
    spec = parse_pool_spec({**MINIMAL, "maxChunkPerGpu": "auto", "expectedChunksPerRequest": 6})
    assert (spec.max_chunk_per_gpu, spec.expected_chunks_per_request) == ("auto", 6)
    assert parse_pool_spec({**MINIMAL, "maxChunkPerGpu": "auto"}).expected_chunks_per_request is None


def test_scaling_rules_carry_the_spec():
    rules = parse_pool_spec({**MINIMAL, "minReplicas": 0, "maxReplicas": 9, "targetQPSPerReplica": 2.5,
                             "scaleUpStabilizationSeconds": 15, "scaleDownStabilizationSeconds": 60}).scaling_rules()
    assert (rules.min_replicas, rules.max_replicas, rules.target_qps_per_replica) == (0, 9, 2.5)
    assert (rules.scale_up_window_s, rules.scale_down_window_s) == (15, 60)


def test_the_predictive_policy_is_the_default_and_the_reactive_one_selectable():
    spec = parse_pool_spec(MINIMAL)
    assert (spec.autoscaling_policy, spec.predictive_rules().queue_per_replica) == ("predictive", 8.0)
    chosen = parse_pool_spec({**MINIMAL, "autoscalingPolicy": "reactive", "queueDepthPerReplica": 2.5})
    assert (chosen.autoscaling_policy, chosen.predictive_rules().queue_per_replica) == ("reactive", 2.5)


def test_the_latency_guard_is_off_unless_the_pool_sets_an_slo():
    assert parse_pool_spec(MINIMAL).predictive_rules().ttft_slo_s is None
    assert parse_pool_spec({**MINIMAL, "ttftSloSeconds": 1.5}).predictive_rules().ttft_slo_s == 1.5


@pytest.mark.parametrize("bad, message", [
    ({"autoscalingPolicy": "keda"}, "spec.autoscalingPolicy must be one of predictive, reactive"),
    ({"queueDepthPerReplica": 0}, "spec.queueDepthPerReplica must be a positive number"),
    ({"ttftSloSeconds": 0}, "spec.ttftSloSeconds must be a positive number"),
    ({"ttftSloSeconds": "1s"}, "spec.ttftSloSeconds must be a positive number"),
    ({"podAnnotations": {"a": 1}}, "spec.podAnnotations must map strings to strings"),
    ({"podAnnotations": ["a"]}, "spec.podAnnotations must map strings to strings"),
])
def test_bad_autoscaling_settings_say_which_field(bad, message):
    with pytest.raises(PoolSpecError, match=message):
        parse_pool_spec({**MINIMAL, **bad})


@pytest.mark.parametrize("replicas, initial", [(None, 2), (0, 2), (3, 3), (50, 6)])
def test_initial_replicas_are_spec_replicas_within_bounds(replicas, initial):
    spec = {**MINIMAL, "minReplicas": 2, "maxReplicas": 6}
    if replicas is not None:
        spec["replicas"] = replicas
    assert parse_pool_spec(spec).initial_replicas() == initial


@pytest.mark.parametrize("bad, message", [
    ({"nodeType": None}, "spec.nodeType is required"),
    ({"model": ""}, "spec.model is required"),
    ({"chunkSize": "big"}, "spec.chunkSize must be an integer"),
    ({"chunkSize": True}, "spec.chunkSize must be an integer"),
    ({"maxChunkPerGpu": 0}, "spec.maxChunkPerGpu must be at least 1"),
    ({"maxChunkPerGpu": "8"}, "spec.maxChunkPerGpu must be an integer or auto, got '8'"),
    ({"maxChunkPerGpu": True}, "spec.maxChunkPerGpu must be an integer or auto"),
    ({"maxChunkPerGpu": "auto", "expectedChunksPerRequest": 0}, "spec.expectedChunksPerRequest must be at least 1"),
    ({"expectedChunksPerRequest": 6}, "spec.expectedChunksPerRequest is read only with spec.maxChunkPerGpu auto"),
    ({"maxChunkPerGpu": 6, "expectedChunksPerRequest": 6}, "read only with spec.maxChunkPerGpu auto"),
    ({"targetQPSPerReplica": -1}, "spec.targetQPSPerReplica must be a positive number"),
    ({"minReplicas": 3, "maxReplicas": 2}, "must not exceed"),
    ({"tolerations": "gpu"}, "list of tolerations"),
    ({"tolerations": [{"effect": "Sometimes"}]}, "unknown effect"),
])
def test_bad_specs_say_which_field(bad, message):
    with pytest.raises(PoolSpecError, match=message):
        parse_pool_spec({**MINIMAL, **bad})


def test_lora_is_off_by_default_and_takes_the_engines_defaults_when_on():
    assert parse_pool_spec(MINIMAL).lora is None
    assert parse_pool_spec({**MINIMAL, "lora": {"maxLoras": 4}}).lora == LoraSpec(
        max_loras=4, max_cpu_loras=8, max_lora_rank=64, kernel="torch", adapter_root="/adapters", claim_name=None)
    lora = parse_pool_spec({**MINIMAL, "lora": {"maxLoras": 2, "maxCpuLoras": 2, "maxLoraRank": 16, "kernel": "triton",
                                                "adapterRoot": "/srv/adapters", "claimName": "adapters.v1"}}).lora
    assert lora == LoraSpec(2, 2, 16, "triton", "/srv/adapters", "adapters.v1")


@pytest.mark.parametrize("lora, message", [
    ("on", "spec.lora must be an object"),
    ({}, "spec.lora.maxLoras is required"),
    ({"maxLoras": 0}, "spec.lora.maxLoras must be at least 1, got 0"),
    ({"maxLoras": "4"}, "spec.lora.maxLoras must be an integer"),
    ({"maxLoras": 4, "maxCpuLoras": 2}, r"spec.lora.maxCpuLoras \(2\) must be at least spec.lora.maxLoras \(4\)"),
    ({"maxLoras": 2, "maxLoraRank": 0}, "spec.lora.maxLoraRank must be at least 1"),
    ({"maxLoras": 2, "kernel": "cuda"}, "spec.lora.kernel must be one of torch, triton, got 'cuda'"),
    ({"maxLoras": 2, "adapterRoot": "adapters"}, "spec.lora.adapterRoot must be an absolute path"),
    ({"maxLoras": 2, "adapterRoot": "/adapters/"}, "spec.lora.adapterRoot must be an absolute path"),
    ({"maxLoras": 2, "adapterRoot": "/a/../etc"}, "spec.lora.adapterRoot must be an absolute path"),
    ({"maxLoras": 2, "adapterRoot": "/tmp"}, "must not be /tmp, /models or under them"),
    ({"maxLoras": 2, "adapterRoot": "/models/adapters"}, "must not be /tmp, /models or under them"),
    ({"maxLoras": 2, "claimName": "Adapters_PVC"}, "spec.lora.claimName must be a PersistentVolumeClaim's name"),
])
def test_bad_lora_settings_say_which_field(lora, message):
    with pytest.raises(PoolSpecError, match=message):
        parse_pool_spec({**MINIMAL, "lora": lora})


def test_the_triton_lora_kernel_needs_a_gpu():
    with pytest.raises(PoolSpecError, match="spec.lora.kernel triton needs a GPU"):
        parse_pool_spec({**MINIMAL, "nodeType": "CPU", "lora": {"maxLoras": 1, "kernel": "triton"}})
    assert parse_pool_spec({**MINIMAL, "nodeType": "CPU", "lora": {"maxLoras": 1}}).lora.kernel == "torch"


def test_compute_settings_are_the_engines_defaults_unless_set():
    assert parse_pool_spec(MINIMAL).engine_settings == {}
    spec = parse_pool_spec({**MINIMAL, "dtype": "bfloat16", "maxNumBatchedTokens": 2048, "maxNumSeqs": 256,
                            "gpuMemoryUtilization": 0.92, "prefixCaching": False})
    assert spec.engine_settings == {"dtype": "bfloat16", "max_num_batched_tokens": 2048, "max_num_seqs": 256,
                                    "gpu_memory_utilization": 0.92, "prefix_caching": False}
    assert parse_pool_spec({**MINIMAL, "gpuMemoryUtilization": 1}).engine_settings["gpu_memory_utilization"] == 1.0


def test_the_overtake_limit_is_the_engines_default_unless_set_and_0_is_a_setting():
    def overtake_limit(spec):
        return parse_pool_spec({**MINIMAL, **spec}).engine_settings.get("overtake_limit_s")

    assert overtake_limit({}) is None and overtake_limit({"overtakeLimitS": None}) is None
    assert overtake_limit({"overtakeLimitS": 2.5}) == 2.5
    zero = overtake_limit({"overtakeLimitS": 0})  # first come, first served
    assert zero == 0.0 and isinstance(zero, float)
    assert overtake_limit({"overtakeLimitS": 30}) == 30.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_engine_dtype_is_accepted_on_a_gpu(dtype):
    assert parse_pool_spec({**MINIMAL, "dtype": dtype}).engine_settings["dtype"] == dtype


def test_the_dtypes_are_the_ones_k25_engine_takes():
    assert build_parser().parse_args(["engine"]).dtype == "auto"  # `k25 engine`'s own default
    for dtype in DTYPES:
        assert build_parser().parse_args(["engine", "--dtype", dtype]).dtype == dtype
    with pytest.raises(SystemExit):  # and nothing else
        build_parser().parse_args(["engine", "--dtype", "fp16"])


@pytest.mark.parametrize("bad, message", [
    ({"dtype": "fp16"}, "spec.dtype must be one of auto, float32, bfloat16, float16, got 'fp16'"),
    ({"dtype": ""}, "spec.dtype must be one of"),
    ({"maxNumBatchedTokens": 0}, "spec.maxNumBatchedTokens must be at least 1, got 0"),
    ({"maxNumBatchedTokens": "512"}, "spec.maxNumBatchedTokens must be an integer"),
    ({"maxNumSeqs": 0}, "spec.maxNumSeqs must be at least 1, got 0"),
    ({"maxNumSeqs": 1.5}, "spec.maxNumSeqs must be an integer"),
    ({"gpuMemoryUtilization": 0}, r"spec.gpuMemoryUtilization must be above 0, got 0"),
    ({"gpuMemoryUtilization": 1.2}, r"spec.gpuMemoryUtilization must be at most 1, got 1.2"),
    ({"gpuMemoryUtilization": "0.9"}, "spec.gpuMemoryUtilization must be a number"),
    ({"gpuMemoryUtilization": True}, "spec.gpuMemoryUtilization must be a number"),
    ({"overtakeLimitS": -1}, r"spec.overtakeLimitS must be at least 0, got -1"),
    ({"overtakeLimitS": -0.5}, r"spec.overtakeLimitS must be at least 0, got -0.5"),
    ({"overtakeLimitS": "5"}, "spec.overtakeLimitS must be a number, got '5'"),
    ({"overtakeLimitS": True}, "spec.overtakeLimitS must be a number, got True"),
    ({"overtakeLimitS": float("nan")}, "spec.overtakeLimitS must be a number, got nan"),
    ({"overtakeLimitS": float("inf")}, "spec.overtakeLimitS must be a number, got inf"),
    ({"quant": "attn=int6"}, "spec.quant "),
    ({"prefixCaching": "no"}, "spec.prefixCaching must be true or false, got 'no'"),
    ({"cudaGraphs": 0}, "spec.cudaGraphs must be true or false, got 0"),
])
def test_bad_compute_settings_say_which_field(bad, message):
    with pytest.raises(PoolSpecError, match=message):
        parse_pool_spec({**MINIMAL, **bad})


def test_float16_needs_a_gpu():
    for cpu in ({"nodeType": "CPU"}, {"nodeType": "CPU", "gpusPerReplica": 0}):
        with pytest.raises(PoolSpecError, match=r"spec.dtype float16 needs a GPU: spec.gpusPerReplica of at least 1"):
            parse_pool_spec({**MINIMAL, **cpu, "dtype": "float16"})
    for dtype in ("auto", "float32", "bfloat16"):
        assert parse_pool_spec({**MINIMAL, "nodeType": "CPU", "dtype": dtype}).engine_settings["dtype"] == dtype
    on_a_gpu = parse_pool_spec({**MINIMAL, "nodeType": "CPU", "gpusPerReplica": 1, "dtype": "float16"})
    assert on_a_gpu.engine_settings["dtype"] == "float16"


def test_engines_drain_for_the_gateways_request_deadline_and_check_no_digest_unless_the_pool_says():
    spec = parse_pool_spec(MINIMAL)
    gateway = build_parser().parse_args(["gateway"])
    assert (spec.drain_timeout_s, spec.model_sha256) == (gateway.request_timeout_s, {})
    digests = {"model.safetensors": "0" * 64, "sub/tokenizer.json": "f" * 64}
    chosen = parse_pool_spec({**MINIMAL, "drainTimeoutSeconds": 0, "modelSha256": digests})
    assert (chosen.drain_timeout_s, chosen.model_sha256) == (0, digests)


@pytest.mark.parametrize("bad, message", [
    ({"drainTimeoutSeconds": -1}, "spec.drainTimeoutSeconds must be at least 0, got -1"),
    ({"drainTimeoutSeconds": 3601}, "spec.drainTimeoutSeconds must be at most 3600, got 3601"),
    ({"drainTimeoutSeconds": 2.5}, "spec.drainTimeoutSeconds must be an integer"),
    ({"modelSha256": ["a" * 64]}, "spec.modelSha256 must map model files to their sha256"),
    ({"modelSha256": {"m.gguf": "A" * 64}}, r"spec.modelSha256\['m.gguf'\] must be 64 lowercase hex digits"),
    ({"modelSha256": {"m.gguf": "a" * 63}}, r"spec.modelSha256\['m.gguf'\] must be 64 lowercase hex digits"),
    ({"modelSha256": {"/models/m.gguf": "a" * 64}}, "'/models/m.gguf' is not a model file name"),
    ({"modelSha256": {"a=b": "a" * 64}}, "'a=b' is not a model file name"),
    ({"modelSha256": {"": "a" * 64}}, "'' is not a model file name"),
])
def test_bad_drain_and_digest_settings_say_which_field(bad, message):
    with pytest.raises(PoolSpecError, match=message):
        parse_pool_spec({**MINIMAL, **bad})


# --- the engine backend: K25's on one GPU, vLLM's over several ---------------------------------

VLLM = {**MINIMAL, "backend": "vllm"}


def test_k25s_engine_runs_on_one_gpu_and_a_pool_over_several_needs_backend_vllm():
    for k25 in (MINIMAL, {**MINIMAL, "backend": "k25"}):
        assert parse_pool_spec({**k25, "gpusPerReplica": 1}).backend == "k25"
        with pytest.raises(PoolSpecError, match=r"^spec.gpusPerReplica 4: K25's engine runs on one GPU; set backend: vllm"):
            parse_pool_spec({**k25, "gpusPerReplica": 4})
    spec = parse_pool_spec({**VLLM, "gpusPerReplica": 4})
    assert (spec.backend, spec.gpus_per_replica) == ("vllm", 4)


@pytest.mark.parametrize("own, message", [
    ({"quant": "small"}, "spec.quant is K25's engine's: backend vllm serves the checkpoint's own quantisation"),
    ({"quant": "none"}, "spec.quant is K25's engine's"),  # the engine refuses any --quant with backend vllm
    ({"maxChunkPerGpu": "auto"}, "spec.maxChunkPerGpu auto is K25's engine's: with backend vllm give a number"),
    ({"maxChunkPerGpu": "auto", "expectedChunksPerRequest": 4}, "spec.maxChunkPerGpu auto is K25's engine's"),
    ({"nodeType": "H200"}, "spec.maxChunkPerGpu is required with backend vllm on node type H200, which has no default"),
    ({"chunkSize": 1000}, r"spec.chunkSize 1000 must be a multiple of 32 with backend vllm"),
    ({"lora": {"maxLoras": 2, "kernel": "triton"}}, "spec.lora.kernel triton is K25's engine's: with backend vllm use torch"),
])
def test_backend_vllm_refuses_what_only_k25s_engine_takes_and_k25s_engine_takes_it(own, message):
    with pytest.raises(PoolSpecError, match=message):
        parse_pool_spec({**VLLM, **own})
    parse_pool_spec({**MINIMAL, **own})


def test_backend_vllm_takes_what_its_engine_serves():
    spec = parse_pool_spec({**VLLM, "nodeType": "H200", "chunkSize": 4096, "maxChunkPerGpu": 6, "gpusPerReplica": 8,
                            "lora": {"maxLoras": 2}, "dtype": "bfloat16"})
    assert (spec.max_chunk_per_gpu, spec.gpus_per_replica, spec.lora.kernel) == (6, 8, "torch")
    # on a CPU vLLM's engine takes as many chunks as fit, as K25's does
    assert parse_pool_spec({**VLLM, "nodeType": "CPU", "chunkSize": 256}).max_chunk_per_gpu is None
