"""The engine's compute settings, one set of flags for every command that runs an engine
(`k25 engine`, `k25 generate`, `k25 bench engine`), and how they become a model and a config."""

import argparse
import logging

from common.engine_settings import SETTINGS, EngineSetting, SettingError

log = logging.getLogger("k25.engine")

def add_engine_settings(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("compute")
    group.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default cpu)")
    for setting in SETTINGS:  # common/engine_settings.py: each declared once, with its pool field
        if setting.kind == "boolean":
            group.add_argument(setting.flag, action=argparse.BooleanOptionalAction, default=setting.default,
                               help=f"{setting.help} (default {'on' if setting.default else 'off'})")
            continue
        default = "unset" if setting.default is None else f"{setting.default:g}" if setting.kind == "number" else setting.default
        group.add_argument(setting.flag, type=_flag_type(setting), default=setting.default, metavar=setting.metavar,
                           choices=setting.choices or None, help=f"{setting.help} (default {default})")
    group.add_argument("--cpu-threads", type=cpu_threads_flag, default="auto", metavar="N|auto",
                       help="threads for the CPU's compute: auto is the CPUs this process may use, its affinity set "
                       "capped by its cgroup's CPU quota (a pod's CPU limit), where torch would start one a core of "
                       "the machine (default auto)")


def _flag_type(setting: EngineSetting):
    def parse(text: str):
        try:
            return setting.parse_flag(text)
        except SettingError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = setting.kind  # argparse names it in "invalid <type> value"
    return parse


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


def cpu_threads_flag(text: str) -> int | str:
    """`--cpu-threads`: threads, or auto (engine/hardware/cpu_threads.py)."""
    return _count_or_auto(text, "threads")


def max_chunk_per_gpu_flag(text: str) -> int | str:
    """`--max-chunk-per-gpu`: chunks, or auto (engine/hardware/chunk_choice.py)."""
    return _count_or_auto(text, "chunks")


def set_cpu_threads(flag: int | str) -> int:
    """torch's intra-op threads (the CPU kernels' too) from --cpu-threads; set before anything
    runs, the dtype measurement included. Returns the count."""
    import torch

    from engine.hardware.cpu_threads import AUTO, default_cpu_threads

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
    from engine.hardware.dtype_choice import choose_dtype, this_cpu_bf16_path
    from engine.model.loader import load_model, model_config
    from engine.quant.check import check_quant, resolve_dtype

    set_cpu_threads(args.cpu_threads)  # the flags' bounds were checked as they were parsed (common/engine_settings.py)
    try:
        quant = parse_quant_spec(args.quant) if args.quant else NO_QUANT
    except QuantSpecError as exc:
        raise EngineConfigError(f"--quant: {exc}") from None
    requested = resolve_dtype(args.dtype, quant)  # auto with quantised weights: bfloat16
    if quant.quantized:  # refused before the weights load
        check_quant(quant, model_config(args.model), args.device, requested)
    on_cpu = requested == "auto" and not args.device.startswith("cuda")
    choice = choose_dtype(requested, args.device, this_cpu_bf16_path() if on_cpu else None)
    reason = "auto with --quant: the quantised kernels take bfloat16" if requested != args.dtype else choice.reason
    log.info("dtype %s (%s)%s", choice.name, reason, f", weights {quant}" if quant.quantized else "")
    model = load_model(args.model, choice.dtype)
    settings = {setting.name: getattr(args, setting.name) for setting in SETTINGS}
    settings.update(dtype=choice.name, quant=str(quant) if quant.quantized else None)  # as resolved above
    config = EngineConfig(device=args.device, **settings, **config_fields)
    return model, config
