"""The engine's compute settings, one set of flags for every command that runs an engine
(`k25 engine`, `k25 generate`, `k25 bench engine`), and how they become a model and a config."""

import argparse
import logging

from common.quant_spec import PRESETS

log = logging.getLogger("k25.engine")

# measured on 2-core CPUs (docs/benchmarks/); on CUDA the same
# defaults hold until a GPU run measures better ones
DEFAULT_MAX_NUM_BATCHED_TOKENS = 512
DEFAULT_MAX_NUM_SEQS = 128
DEFAULT_OVERTAKE_LIMIT_S = 5.0


def add_engine_settings(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("compute")
    group.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default cpu)")
    group.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                       help="weights, activations and KV cache: auto is bfloat16 on CUDA and on a CPU whichever of "
                       "float32 and bfloat16 multiplies the model's matrices faster there, measured at start (default auto)")
    group.add_argument("--quant", default=None, metavar="SPEC",
                       help="weight width per layer type, e.g. embed=bf16,attn=int8,mlp=int4:g64,head=int8, or a "
                       f"preset ({', '.join(PRESETS)}); types not named stay bf16; needs bfloat16 (auto picks it) "
                       "(default: none)")
    group.add_argument("--max-num-batched-tokens", type=int, default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
                       help=f"the token budget of one step, decodes and prefill slices together (default {DEFAULT_MAX_NUM_BATCHED_TOKENS})")
    group.add_argument("--max-num-seqs", type=int, default=DEFAULT_MAX_NUM_SEQS,
                       help=f"sequences running at once (default {DEFAULT_MAX_NUM_SEQS})")
    group.add_argument("--overtake-limit-s", type=seconds_flag, default=DEFAULT_OVERTAKE_LIMIT_S, metavar="SECONDS",
                       help="waiting requests are admitted fewest prompt tokens left to compute first (a question about "
                       "a cached document before a new document); one that has waited this long goes first-come-first-"
                       f"served again; 0: first come, first served (default {DEFAULT_OVERTAKE_LIMIT_S:g})")
    group.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                       help="reuse the KV of full blocks whose prompt prefix was computed before (default on)")
    group.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True,
                       help="on CUDA, decode steps of up to --max-num-seqs sequences replay CUDA graphs captured at "
                       "start (one launch a step instead of one a kernel); --no-cuda-graphs runs every step eagerly "
                       "(default on; no effect off CUDA)")
    group.add_argument("--gpu-memory-utilization", type=float, default=0.90,
                       help="fraction of GPU memory that weights and KV cache may use (default 0.90)")
    group.add_argument("--cpu-threads", type=cpu_threads_flag, default="auto", metavar="N|auto",
                       help="threads for the CPU's compute: auto is the CPUs this process may use, its affinity set "
                       "capped by its cgroup's CPU quota (a pod's CPU limit), where torch would start one a core of "
                       "the machine (default auto)")


def _count_or_auto(text: str, unit: str) -> int | str:
    """A flag's value: a whole number of `unit`, at least 1, or "auto"."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of {unit} or auto, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (or auto), got {value}")
    return value


def seconds_flag(text: str) -> float:
    """A flag's value: 0 or more seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 0 <= value < float("inf"):  # NaN too
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {text}")
    return value


def cpu_threads_flag(text: str) -> int | str:
    """`--cpu-threads`: threads, or auto (engine/cpu_threads.py)."""
    return _count_or_auto(text, "threads")


def max_chunk_per_gpu_flag(text: str) -> int | str:
    """`--max-chunk-per-gpu`: chunks, or auto (engine/chunk_choice.py)."""
    return _count_or_auto(text, "chunks")


def set_cpu_threads(flag: int | str) -> int:
    """torch's intra-op threads (the CPU kernels' too) from --cpu-threads; set before anything
    runs, the dtype measurement included. Returns the count."""
    import torch

    from engine.cpu_threads import AUTO, default_cpu_threads

    threads = default_cpu_threads() if flag == AUTO else flag
    torch.set_num_threads(threads)
    log.info("%d CPU threads (%s)", threads, "the CPUs this process may use" if flag == AUTO else "--cpu-threads")
    return threads


def load_for_engine(args: argparse.Namespace, **config_fields):
    """Resolve --dtype (and check --quant), load the model straight into it, and build the EngineConfig.
    Raises ModelLoadError or EngineConfigError with a message for the user."""
    from common.quant_spec import NO_QUANT, QuantSpecError, parse_quant_spec
    from engine.base.config import EngineConfig
    from engine.base.errors import EngineConfigError
    from engine.dtype_choice import choose_dtype, matmul_seconds
    from engine.loader import load_model, model_config
    from engine.quant.check import check_quant, resolve_dtype

    set_cpu_threads(args.cpu_threads)
    if not 0 < args.gpu_memory_utilization <= 1:
        raise EngineConfigError(f"--gpu-memory-utilization must be in (0, 1], got {args.gpu_memory_utilization}")
    if args.max_num_batched_tokens < 1 or args.max_num_seqs < 1:
        raise EngineConfigError("--max-num-batched-tokens and --max-num-seqs must be at least 1")
    try:
        quant = parse_quant_spec(args.quant) if args.quant else NO_QUANT
    except QuantSpecError as exc:
        raise EngineConfigError(f"--quant: {exc}") from None
    requested = resolve_dtype(args.dtype, quant)  # auto with quantised weights: bfloat16
    if quant.quantized:  # refused before the weights load
        check_quant(quant, model_config(args.model), args.device, requested)
    measure = None
    if requested == "auto" and not args.device.startswith("cuda"):
        measure = matmul_seconds(model_config(args.model), (1, args.max_num_seqs))
    choice = choose_dtype(requested, args.device, measure)
    reason = "auto with --quant: the quantised kernels take bfloat16" if requested != args.dtype else choice.reason
    log.info("dtype %s (%s)%s", choice.name, reason, f", weights {quant}" if quant.quantized else "")
    model = load_model(args.model, choice.dtype)
    config = EngineConfig(
        device=args.device, dtype=choice.name, quant=str(quant) if quant.quantized else None,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs, overtake_limit_s=args.overtake_limit_s, gpu_memory_utilization=args.gpu_memory_utilization,
        prefix_caching=args.prefix_caching, cuda_graphs=args.cuda_graphs, **config_fields,
    )
    return model, config
