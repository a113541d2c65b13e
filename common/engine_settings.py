"""The engine's compute settings, each declared once: its `k25 engine` flag, its EnginePool
field (the same key in the chart's pools and `engine` defaults), type, default, bounds and help.

From this table come the flags of every command that runs an engine (k25/commands/
engine_settings.py), the operator's reading of a pool's spec and the engine arguments it writes
(operators/pool_spec.py, operators/deployment.py), and the chart's parts that name settings: the
EnginePool CRD's fields, values.schema.json, values.yaml and the template's list (written by
charts/gen_engine_settings.py, `make engine-settings`; a test fails when they are stale). Parsing
only, no torch, so the operator and the gateway-free parts import it cheaply."""

import math
from dataclasses import dataclass

from common.quant_spec import PRESETS, QuantSpecError, parse_quant_spec, quant_spec_pattern

DTYPES = ("auto", "float32", "bfloat16", "float16")
BACKENDS = ("k25", "vllm")  # K25's engine (engine/llm_engine.py), vLLM's (engine/vllm_core/)
# tokens per KV block with backend vllm: vLLM's CPU attention takes multiples of 32, its CUDA ones
# take 32 too; a pool's chunk_size must be a multiple of it (engine/vllm_core/settings.py, operators/pool_spec.py)
VLLM_BLOCK_SIZE = 32
# with backend vllm over several nodes: the port of torch.distributed's store on the first node, vLLM's
# default (k25 engine --master-port, operators/leader_worker_set.py)
VLLM_MASTER_PORT = 29501


class SettingError(ValueError):
    """A value a setting cannot take; the message says why (the caller names where it came from)."""


@dataclass(frozen=True)
class EngineSetting:
    name: str  # the EngineConfig field and the `k25 engine` argument's dest
    field: str  # the EnginePool's spec field, the chart's pool key and `engine` default
    kind: str  # its JSON-schema type: integer, number, boolean or string
    default: object  # the engine's default (None: unset)
    help: str  # what it does, without its default (flags append it)
    minimum: float | None = None
    exclusive_minimum: bool = False  # the minimum itself is refused
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    pattern: str | None = None  # a string's schema pattern (the parser may refuse more)
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def check(self, value):
        """`value` as the engine takes it, or SettingError saying why it cannot be."""
        if self.kind == "boolean":
            if not isinstance(value, bool):
                raise SettingError(f"must be true or false, got {value!r}")
            return value
        if self.kind == "string":
            if not isinstance(value, str) or (self.choices and value not in self.choices):
                expected = f"one of {', '.join(self.choices)}" if self.choices else "a string"
                raise SettingError(f"must be {expected}, got {value!r}")
            if self.name == "quant":
                try:
                    parse_quant_spec(value)
                except QuantSpecError as exc:
                    raise SettingError(f"is not a weight spec: {exc}") from None
            return value
        numeric = (int,) if self.kind == "integer" else (int, float)
        if isinstance(value, bool) or not isinstance(value, numeric) or not math.isfinite(value):
            raise SettingError(f"must be {'an integer' if self.kind == 'integer' else 'a number'}, got {value!r}")
        if self.minimum is not None and (value <= self.minimum if self.exclusive_minimum else value < self.minimum):
            raise SettingError(f"must be {'above' if self.exclusive_minimum else 'at least'} {self.minimum:g}, got {value!r}")
        if self.maximum is not None and value > self.maximum:
            raise SettingError(f"must be at most {self.maximum:g}, got {value!r}")
        return value if self.kind == "integer" else float(value)

    def parse_flag(self, text: str):
        """The flag's text as a value (argparse's `type`)."""
        numbers = {"integer": (int, "an integer"), "number": (float, "a number")}
        if self.kind not in numbers:
            return self.check(text)
        convert, expected = numbers[self.kind]
        try:
            value = convert(text)
        except ValueError:
            raise SettingError(f"expected {expected}, got {text!r}") from None
        return self.check(value)

    def engine_args(self, value) -> list[str]:
        """The `k25 engine` arguments that set `value`."""
        if self.kind == "boolean":
            return [self.flag if value else "--no-" + self.flag[2:]]
        return [self.flag, str(value)]


SETTINGS = (
    EngineSetting(
        "backend", "backend", "string", "k25", choices=BACKENDS,
        help="the engine that computes: k25, K25's own (one GPU or a CPU), or vllm, vLLM's engine in the same "
             "process behind the same wire, for the models and GPU counts K25's does not serve (the engine-vllm "
             "image; here, .venv-vllm from `make vllm`)",
    ),
    EngineSetting(
        "expert_parallel", "expertParallel", "boolean", False,
        help="with backend vllm, a mixture of experts' experts are spread over the tensor-parallel ranks "
             "(vLLM's expert parallelism) instead of each expert being split across them; K25's engine refuses it",
    ),
    EngineSetting(
        "pipeline_parallel_size", "nodesPerReplica", "integer", 1, minimum=1, metavar="STAGES",
        help="with backend vllm, pipeline stages of one engine, its layers split among them (vLLM's pipeline "
             "parallelism); a pool runs one stage a node, so each replica spans this many nodes (a LeaderWorkerSet "
             "group), each stage over gpusPerReplica GPUs (tensor parallel); K25's engine refuses more than 1",
    ),
    EngineSetting(
        "dtype", "dtype", "string", "auto", choices=DTYPES,
        help="weights, activations and KV cache; auto is bfloat16 on CUDA and on a CPU where the engine's bf16 "
             "projections run (AVX512-BF16, AMX or AVX2), else float32; float16 needs a GPU",
    ),
    EngineSetting(
        "quant", "quant", "string", None, pattern=quant_spec_pattern(), metavar="SPEC",
        help="weight width per layer type, e.g. embed=bf16,attn=int8,mlp=int4:g64,head=int8, or a preset "
             f"({', '.join(PRESETS)}); types not named stay bf16; needs dtype bfloat16 or auto; unset: unquantised",
    ),
    # the token budget's and the sequences' defaults were measured on 2-core CPUs (docs/benchmarks/);
    # on CUDA they hold until a GPU run measures better ones
    EngineSetting(
        "max_num_batched_tokens", "maxNumBatchedTokens", "integer", 512, minimum=1,
        help="the token budget of one step, decodes and prefill slices together",
    ),
    EngineSetting("max_num_seqs", "maxNumSeqs", "integer", 128, minimum=1, help="sequences running at once"),
    EngineSetting(
        "gpu_memory_utilization", "gpuMemoryUtilization", "number", 0.90, minimum=0, exclusive_minimum=True, maximum=1,
        help="fraction of GPU memory that weights and KV cache may use",
    ),
    EngineSetting(
        "overtake_limit_s", "overtakeLimitS", "number", 5.0, minimum=0, metavar="SECONDS",
        help="waiting requests are admitted fewest prompt tokens left to compute first (a question about a cached "
             "document before a new document); one that has waited this long goes first-come-first-served again; "
             "0: first come, first served",
    ),
    EngineSetting(
        "prefix_caching", "prefixCaching", "boolean", True,
        help="reuse the KV of full blocks whose prompt prefix was computed before",
    ),
    EngineSetting(
        "cuda_graphs", "cudaGraphs", "boolean", True,
        help="on CUDA, decode steps of up to max-num-seqs sequences replay CUDA graphs captured at start (one launch "
             "a step instead of one a kernel); off: every step runs eagerly; no effect off CUDA",
    ),
    EngineSetting(
        "kv_host_tier_gib", "kvHostTierGib", "number", 4.0, minimum=0, metavar="GIB",
        help="host memory (pinned on CUDA) that keeps prefix KV blocks the device evicts, so a prompt found there is "
             "copied back instead of computed; capped at half the host memory available at start; 0: off",
    ),
    EngineSetting(
        "kv_disk_tier_path", "kvDiskTierPath", "string", None, metavar="DIR",
        help="a local directory (an emptyDir or NVMe mount) where evicted prefix KV blocks are written, checksummed, "
             "and found again after a restart; the engine refuses to start if it is not writable; unset: no disk tier",
    ),
    EngineSetting(
        "kv_disk_tier_gib", "kvDiskTierGib", "number", 16.0, minimum=0, exclusive_minimum=True, metavar="GIB",
        help="what the disk tier's block files may take",
    ),
    EngineSetting(
        "kv_tier_recency_weight", "kvTierRecencyWeight", "number", 0.5, minimum=0, maximum=1,
        help="how the KV tiers choose what to give up: the weight of recency against frequency of use (1: least "
             "recently used first, 0: least often used first)",
    ),
    EngineSetting(
        "kv_tier_decay_per_s", "kvTierDecayPerS", "number", 0.01, minimum=0, metavar="RATE",
        help="the rate per second at which a stored KV block's recency decays (exponentially) in the tiers' score",
    ),
)
BY_NAME = {setting.name: setting for setting in SETTINGS}
BY_FIELD = {setting.field: setting for setting in SETTINGS}


def read_spec(spec: dict, path: str = "spec") -> dict[str, object]:
    """The settings a pool's spec sets (by name; absent or null: the engine's default), each
    checked; SettingError names the field."""
    values = {}
    for setting in SETTINGS:
        if spec.get(setting.field) is None:
            continue
        try:
            values[setting.name] = setting.check(spec[setting.field])
        except SettingError as exc:
            raise SettingError(f"{path}.{setting.field} {exc}") from None
    return values


def engine_args(values: dict[str, object]) -> list[str]:
    """`k25 engine` arguments for the settings in `values` (by name); the rest keep their defaults
    (a switch is written only where it differs from its default)."""
    return [
        arg for setting in SETTINGS if setting.name in values
        and not (setting.kind == "boolean" and values[setting.name] == setting.default)
        for arg in setting.engine_args(values[setting.name])
    ]
