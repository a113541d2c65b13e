"""An EnginePool's spec as a typed value, with the defaults and checks of its CRD (the
API server enforces them too; checking here keeps the operator honest on any server)."""

import re
from dataclasses import dataclass, field

from common.engine_settings import BY_NAME, VLLM_BLOCK_SIZE, SettingError, read_spec
from common.quant_spec import parse_quant_spec
from operators.autoscale_policy import ScalingRules
from operators.engine_pod import DEFAULT_RESOURCES, parse_resources
from operators.predictive_policy import PredictiveRules

# KV chunks per GPU by node type (DESIGN.md, Capacity); None: the engine takes as many as fit
MAX_CHUNK_PER_GPU = {"A100-40G": 2, "A100-80G": 4, "H100-80G": 8, "H200": None, "CPU": None}
# maxChunkPerGpu auto: the engine computes it at start from what fits and expectedChunksPerRequest
# (engine/hardware/chunk_choice.py); `k25 bench profile` measures a value to paste instead
AUTO = "auto"
GPU_TAINT_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
LORA_KERNELS = ("torch", "triton")
AUTOSCALING_POLICIES = ("predictive", "reactive")
# an absolute path of plain segments (no '.', '..', '//' or trailing '/'), as the CRD's pattern
ADAPTER_ROOT = re.compile(r"(/[A-Za-z0-9_-][A-Za-z0-9._-]*)+")
# the engine pod's mounts (operators/deployment.py): /tmp, its one writable place under a
# read-only root, and the models claim; an adapter mount at or under either would clash
SCRATCH_MOUNT = "/tmp"
MODELS_MOUNT = "/models"
CLAIM_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# modelSha256: a file of the model (relative to its folder, or the GGUF file's name) -> its digest;
# the engine gets FILE=HEX, so a file name has no '=' (and is not absolute)
MODEL_FILE = re.compile(r"[^/=][^=]*")
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
MAX_DRAIN_TIMEOUT_S = 3600
# the gateway's default request deadline (k25 gateway --request-timeout-s): a pod that stops lets
# every request it runs reach it, so a scale-down or a rollout cuts no answer
DEFAULT_DRAIN_TIMEOUT_S = 600


class PoolSpecError(ValueError):
    """The spec cannot be served; the message says which field and why."""


@dataclass(frozen=True)
class LoraSpec:
    """The engines' LoRA settings (`k25 engine --max-loras ...`) and where their adapters come from."""
    max_loras: int
    max_cpu_loras: int = 8
    max_lora_rank: int = 64
    kernel: str = "torch"
    adapter_root: str = "/adapters"
    claim_name: str | None = None  # None: the release's models claim


@dataclass(frozen=True)
class EnginePoolSpec:
    node_type: str
    model: str
    chunk_size: int
    max_chunk_per_gpu: int | str | None  # "auto": the engine computes it at start (engine/hardware/chunk_choice.py)
    image: str = "k25:latest"
    gpus_per_replica: int = 1
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict, ...] = (GPU_TAINT_TOLERATION,)
    replicas: int | None = None
    min_replicas: int = 1
    max_replicas: int = 4
    target_qps_per_replica: float = 80.0
    scale_up_window_s: float = 0.0
    scale_down_window_s: float = 300.0
    autoscaling_policy: str = "predictive"
    queue_depth_per_replica: float = 8.0
    ttft_slo_s: float | None = None  # the latency guard's SLO; None: no latency guard
    pod_annotations: dict[str, str] = field(default_factory=dict)  # on the engine pods (the chart's secrets digest)
    lora: LoraSpec | None = None  # None: adapters off
    # the engines' compute settings the spec sets, by name (common/engine_settings.py); the rest
    # are the engine's defaults
    engine_settings: dict[str, object] = field(default_factory=dict)
    expected_chunks_per_request: int | None = None  # with max_chunk_per_gpu auto; None: the engine's default
    drain_timeout_s: int = DEFAULT_DRAIN_TIMEOUT_S  # on SIGTERM, running requests get this long to finish
    resources: dict[str, dict[str, str]] = field(default_factory=lambda: DEFAULT_RESOURCES)  # CPU and memory
    priority_class_name: str | None = None
    model_sha256: dict[str, str] = field(default_factory=dict)  # file -> the sha256 the engine checks

    def scaling_rules(self) -> ScalingRules:
        return ScalingRules(min_replicas=self.min_replicas, max_replicas=self.max_replicas,
                            target_qps_per_replica=self.target_qps_per_replica,
                            scale_up_window_s=self.scale_up_window_s,
                            scale_down_window_s=self.scale_down_window_s)

    def predictive_rules(self) -> PredictiveRules:
        return PredictiveRules(queue_per_replica=self.queue_depth_per_replica, ttft_slo_s=self.ttft_slo_s)

    def initial_replicas(self) -> int:
        wanted = self.min_replicas if self.replicas is None else self.replicas
        return min(max(wanted, self.min_replicas), self.max_replicas)

    @property
    def backend(self) -> str:
        return self.engine_settings.get("backend", BY_NAME["backend"].default)

    @property
    def nodes_per_replica(self) -> int:
        """Nodes one engine spans: a pipeline stage a node (a LeaderWorkerSet group when above 1)."""
        return self.engine_settings.get("pipeline_parallel_size", BY_NAME["pipeline_parallel_size"].default)


def parse_pool_spec(spec: dict) -> EnginePoolSpec:
    for name in ("nodeType", "model", "chunkSize"):
        if spec.get(name) in (None, ""):
            raise PoolSpecError(f"spec.{name} is required")
    node_type = str(spec["nodeType"])
    is_cpu = node_type == "CPU"
    max_chunk = spec.get("maxChunkPerGpu", MAX_CHUNK_PER_GPU.get(node_type))
    if max_chunk is None and node_type not in MAX_CHUNK_PER_GPU:
        raise PoolSpecError(f"spec.maxChunkPerGpu is required for node type {node_type!r}, which has no "
                            f"hardware profile (known: {', '.join(MAX_CHUNK_PER_GPU)})")
    engine_settings = _engine_settings(spec)
    parsed = EnginePoolSpec(
        node_type=node_type,
        model=str(spec["model"]),
        chunk_size=_integer(spec, "chunkSize", None, least=1),
        max_chunk_per_gpu=None if max_chunk is None else _max_chunk_per_gpu(max_chunk),
        expected_chunks_per_request=_optional_integer(spec, "expectedChunksPerRequest", least=1),
        image=str(spec.get("image") or "k25:latest"),
        gpus_per_replica=_integer(spec, "gpusPerReplica", 0 if is_cpu else 1, least=0 if is_cpu else 1),
        node_selector={str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()},
        tolerations=_tolerations(spec) if "tolerations" in spec else (() if is_cpu else (GPU_TAINT_TOLERATION,)),
        replicas=None if spec.get("replicas") is None else _integer(spec, "replicas", None, least=0),
        min_replicas=_integer(spec, "minReplicas", 1, least=0),
        max_replicas=_integer(spec, "maxReplicas", 4, least=1),
        target_qps_per_replica=_positive(spec, "targetQPSPerReplica", 80.0),
        scale_up_window_s=_integer(spec, "scaleUpStabilizationSeconds", 0, least=0),
        scale_down_window_s=_integer(spec, "scaleDownStabilizationSeconds", 300, least=0),
        autoscaling_policy=_autoscaling_policy(spec.get("autoscalingPolicy", "predictive")),
        queue_depth_per_replica=_positive(spec, "queueDepthPerReplica", 8.0),
        ttft_slo_s=None if spec.get("ttftSloSeconds") is None else _positive(spec, "ttftSloSeconds", 0),
        pod_annotations=_string_map(spec, "podAnnotations"),
        lora=None if spec.get("lora") is None else _lora(spec["lora"]),
        engine_settings=engine_settings,
        drain_timeout_s=_integer(spec, "drainTimeoutSeconds", DEFAULT_DRAIN_TIMEOUT_S, least=0, most=MAX_DRAIN_TIMEOUT_S),
        resources=_resources(spec.get("resources"), engine_settings),
        priority_class_name=spec.get("priorityClassName") or None,
        model_sha256=_model_sha256(spec.get("modelSha256") or {}),
    )
    if parsed.min_replicas > parsed.max_replicas:
        raise PoolSpecError(f"spec.minReplicas ({parsed.min_replicas}) must not exceed "
                            f"spec.maxReplicas ({parsed.max_replicas})")
    if parsed.lora is not None and parsed.lora.kernel == "triton" and not parsed.gpus_per_replica:
        raise PoolSpecError("spec.lora.kernel triton needs a GPU: spec.gpusPerReplica of at least 1")
    dtype, quant = parsed.engine_settings.get("dtype"), parsed.engine_settings.get("quant")
    if dtype == "float16" and not parsed.gpus_per_replica:
        raise PoolSpecError("spec.dtype float16 needs a GPU: spec.gpusPerReplica of at least 1 "
                            "(on a CPU use float32, bfloat16 or auto)")
    if parsed.expected_chunks_per_request is not None and parsed.max_chunk_per_gpu != AUTO:
        raise PoolSpecError("spec.expectedChunksPerRequest is read only with spec.maxChunkPerGpu auto")
    if quant is not None and parse_quant_spec(quant).quantized and dtype not in (None, "auto", "bfloat16"):
        raise PoolSpecError(f"spec.quant needs dtype bfloat16 or auto (the quantised kernels take bfloat16 "
                            f"activations), got {dtype}")
    refusal = backend_refusal(parsed)
    if refusal is not None:
        raise PoolSpecError(refusal)
    return parsed


def backend_refusal(spec: EnginePoolSpec) -> str | None:
    """Why the pool's backend cannot serve its spec, or None. K25's engine runs on one GPU; vLLM's
    spans gpusPerReplica (tensor parallel) on each of nodesPerReplica nodes (pipeline parallel) but
    takes none of the settings only K25's engine has."""
    if spec.backend == "k25":
        if spec.gpus_per_replica > 1:
            return (f"spec.gpusPerReplica {spec.gpus_per_replica}: K25's engine runs on one GPU; "
                    "set backend: vllm to serve the model over several (tensor parallel)")
        if spec.engine_settings.get("expert_parallel"):
            return "spec.expertParallel: K25's engine serves no mixture of experts; set backend: vllm"
        if spec.nodes_per_replica > 1:
            return (f"spec.nodesPerReplica {spec.nodes_per_replica}: K25's engine runs on one node; set backend: vllm "
                    "to serve the model over several (pipeline parallel)")
        return None
    if spec.engine_settings.get("quant") is not None:
        return "spec.quant is K25's engine's: backend vllm serves the checkpoint's own quantisation; leave quant unset"
    if spec.max_chunk_per_gpu == AUTO:
        return "spec.maxChunkPerGpu auto is K25's engine's: with backend vllm give a number"
    if spec.max_chunk_per_gpu is None and spec.gpus_per_replica:
        return (f"spec.maxChunkPerGpu is required with backend vllm on node type {spec.node_type}, which has no "
                "default: vLLM's KV cache is sized from it (only K25's engine computes what fits)")
    if spec.chunk_size % VLLM_BLOCK_SIZE:
        return (f"spec.chunkSize {spec.chunk_size} must be a multiple of {VLLM_BLOCK_SIZE} with backend vllm "
                "(its KV block)")
    if spec.lora is not None and spec.lora.kernel == "triton":
        return ("spec.lora.kernel triton is K25's engine's: with backend vllm use torch (vLLM applies adapters with "
                "its own kernels)")
    return None


def _max_chunk_per_gpu(value) -> int | str:
    if value == AUTO:
        return AUTO
    if isinstance(value, bool) or not isinstance(value, int):
        raise PoolSpecError(f"spec.maxChunkPerGpu must be an integer or {AUTO}, got {value!r}")
    return _integer({"maxChunkPerGpu": value}, "maxChunkPerGpu", None, least=1)


def _autoscaling_policy(policy) -> str:
    if policy not in AUTOSCALING_POLICIES:
        raise PoolSpecError(f"spec.autoscalingPolicy must be one of {', '.join(AUTOSCALING_POLICIES)}, got {policy!r}")
    return policy


def _engine_settings(spec: dict) -> dict[str, object]:
    try:
        return read_spec(spec)
    except SettingError as exc:
        raise PoolSpecError(str(exc)) from None


def _setting(engine_settings: dict[str, object], name: str):
    return engine_settings.get(name, BY_NAME[name].default)


def _resources(value, engine_settings: dict[str, object]) -> dict[str, dict[str, str]]:
    # K25's engine keeps a KV host tier unless prefix caching is off; vLLM's has none of ours
    tiers = _setting(engine_settings, "backend") == "k25" and _setting(engine_settings, "prefix_caching")
    host_tier_gib = _setting(engine_settings, "kv_host_tier_gib") if tiers else 0
    try:
        return parse_resources(value, host_tier_gib)
    except ValueError as exc:
        raise PoolSpecError(f"spec.resources {exc}") from None


def _lora(lora) -> LoraSpec:
    if not isinstance(lora, dict):
        raise PoolSpecError(f"spec.lora must be an object {{maxLoras, ...}}, got {lora!r}")
    if "maxLoras" not in lora:
        raise PoolSpecError("spec.lora.maxLoras is required (adapters on the device at once)")
    parsed = LoraSpec(
        max_loras=_integer(lora, "maxLoras", None, least=1, path="spec.lora"),
        max_cpu_loras=_integer(lora, "maxCpuLoras", 8, least=1, path="spec.lora"),
        max_lora_rank=_integer(lora, "maxLoraRank", 64, least=1, path="spec.lora"),
        kernel=lora.get("kernel", "torch"),
        adapter_root=lora.get("adapterRoot", "/adapters"),
        claim_name=lora.get("claimName"),
    )
    if parsed.max_cpu_loras < parsed.max_loras:
        raise PoolSpecError(f"spec.lora.maxCpuLoras ({parsed.max_cpu_loras}) must be at least "
                            f"spec.lora.maxLoras ({parsed.max_loras})")
    if parsed.kernel not in LORA_KERNELS:
        raise PoolSpecError(f"spec.lora.kernel must be one of {', '.join(LORA_KERNELS)}, got {parsed.kernel!r}")
    root = parsed.adapter_root
    if not isinstance(root, str) or not ADAPTER_ROOT.fullmatch(root):
        raise PoolSpecError(f"spec.lora.adapterRoot must be an absolute path such as /adapters, got {root!r}")
    if any(root == mount or root.startswith(mount + "/") for mount in (SCRATCH_MOUNT, MODELS_MOUNT)):
        raise PoolSpecError(f"spec.lora.adapterRoot must not be {SCRATCH_MOUNT}, {MODELS_MOUNT} or under them, "
                            f"got {root!r}")
    claim = parsed.claim_name
    if claim is not None and not (isinstance(claim, str) and CLAIM_NAME.fullmatch(claim)):
        raise PoolSpecError(f"spec.lora.claimName must be a PersistentVolumeClaim's name, got {claim!r}")
    return parsed


def _model_sha256(digests) -> dict[str, str]:
    if not isinstance(digests, dict):
        raise PoolSpecError(f"spec.modelSha256 must map model files to their sha256, got {digests!r}")
    for file, digest in digests.items():
        if not isinstance(file, str) or not MODEL_FILE.fullmatch(file):
            raise PoolSpecError(f"spec.modelSha256: {file!r} is not a model file name (relative, without '=')")
        if not isinstance(digest, str) or not SHA256_HEX.fullmatch(digest):
            raise PoolSpecError(f"spec.modelSha256[{file!r}] must be 64 lowercase hex digits, got {digest!r}")
    return dict(digests)


def _tolerations(spec: dict) -> tuple[dict, ...]:
    tolerations = spec["tolerations"]
    if not isinstance(tolerations, list) or not all(isinstance(t, dict) for t in tolerations):
        raise PoolSpecError("spec.tolerations must be a list of tolerations")
    for toleration in tolerations:
        if toleration.get("operator", "Equal") not in ("Exists", "Equal"):
            raise PoolSpecError(f"spec.tolerations: operator must be Exists or Equal, got {toleration['operator']!r}")
        if toleration.get("effect", "NoSchedule") not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise PoolSpecError(f"spec.tolerations: unknown effect {toleration['effect']!r}")
    return tuple(tolerations)


def _integer(spec: dict, name: str, default: int | None, least: int, path: str = "spec",
             most: int | None = None) -> int:
    value = spec.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise PoolSpecError(f"{path}.{name} must be an integer, got {value!r}")
    if value < least:
        raise PoolSpecError(f"{path}.{name} must be at least {least}, got {value}")
    if most is not None and value > most:
        raise PoolSpecError(f"{path}.{name} must be at most {most}, got {value}")
    return value


def _optional_integer(spec: dict, name: str, least: int) -> int | None:
    return None if spec.get(name) is None else _integer(spec, name, None, least=least)


def _string_map(spec: dict, name: str) -> dict[str, str]:
    value = spec.get(name) or {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise PoolSpecError(f"spec.{name} must map strings to strings, got {value!r}")
    return dict(value)


def _positive(spec: dict, name: str, default: float) -> float:
    value = spec.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise PoolSpecError(f"spec.{name} must be a positive number, got {value!r}")
    return float(value)
