"""`k25 engine --backend`: which engine computes behind the ZMQ server. Both implement the
engine-core contract (engine/core/contract.py): K25's own (engine/llm_engine.py) or vLLM's
(engine/vllm_core/), which needs vLLM installed in this Python."""

import argparse
import importlib.util
import os

from engine.base.errors import EngineConfigError

VLLM_MISSING = ("--backend vllm needs vLLM in this Python ({python}): the engine-vllm image has it; here, `make vllm` "
                "builds .venv-vllm (vLLM's CPU build) and .venv-vllm/bin/k25 engine --backend vllm runs it")


def vllm_python() -> str:
    """The Python that runs `k25 engine --backend vllm` for `k25 up`: this one if it has vLLM, else
    the checkout's .venv-vllm (`make vllm`). Raises EngineConfigError if neither has it."""
    import sys
    from pathlib import Path

    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    beside = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
    if beside.exists():
        return str(beside)
    raise EngineConfigError(VLLM_MISSING.format(python=sys.executable))


def engine_config_fields(args: argparse.Namespace) -> dict:
    """The EngineConfig fields `k25 engine` takes from its own flags (the compute settings come
    from the settings table)."""
    return dict(
        chunk_size=args.chunk_size, max_chunk_per_gpu=args.max_chunk_per_gpu, node_type=args.node_type,
        expected_chunks_per_request=args.expected_chunks_per_request, max_waiting=args.max_waiting,
        max_loras=args.max_loras, max_cpu_loras=args.max_cpu_loras, max_lora_rank=args.max_lora_rank,
        adapter_root=args.adapter_root, lora_kernel=args.lora_kernel,
    )


def start_backend(args: argparse.Namespace):
    """The engine `args` ask for, loaded and ready to step. Raises ModelLoadError or
    EngineConfigError with a message for the user."""
    if args.backend == "vllm":
        return _start_vllm(args)
    from engine.llm_engine import LLMEngine
    from k25.commands.engine_settings import load_for_engine

    model, config = load_for_engine(args, **engine_config_fields(args))
    return LLMEngine(model, config)  # it keeps what it needs of `model`; the loaded tensors are not kept twice


def _start_vllm(args: argparse.Namespace):
    from engine.vllm_core.core import VLLMEngineCore

    config, group = _vllm_config(args)
    return VLLMEngineCore(config, args.model, args.tensor_parallel_size, args.enforce_eager, group)


def serve_vllm_workers(args: argparse.Namespace) -> int:
    """`k25 engine --backend vllm --node-rank R` (R > 0): vLLM's headless workers for this node,
    with the engine arguments node 0's engine builds from the same flags. Returns the exit status."""
    from engine.vllm_core.engine_plan import plan_engine
    from engine.vllm_core.headless import serve_headless

    config, group = _vllm_config(args)
    return serve_headless(plan_engine(config, args.model, args.tensor_parallel_size, args.enforce_eager, group))


def _vllm_config(args: argparse.Namespace):
    """The EngineConfig and node group of `k25 engine --backend vllm`; on a CPU, this process's
    threads split among its ranks."""
    import sys

    if importlib.util.find_spec("vllm") is None:
        raise EngineConfigError(VLLM_MISSING.format(python=sys.executable))
    from common.engine_settings import SETTINGS
    from engine.base.config import EngineConfig
    from engine.vllm_core.settings import NodeGroup, omp_threads_bind
    from k25.commands.engine_settings import set_cpu_threads

    threads = set_cpu_threads(args.cpu_threads)
    group = NodeGroup(args.nnodes, args.node_rank, args.master_addr, args.master_port)
    local_ranks = args.tensor_parallel_size * args.pipeline_parallel_size // args.nnodes
    if not args.device.startswith("cuda"):
        cpus = os.sched_getaffinity(0)
        if len(cpus) < local_ranks:
            raise EngineConfigError(f"{local_ranks} ranks on this node's CPU need a CPU each (--tensor-parallel-size "
                                    f"x --pipeline-parallel-size / --nnodes); this process may use {len(cpus)}")
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", omp_threads_bind(cpus, threads, local_ranks))
    settings = {setting.name: getattr(args, setting.name) for setting in SETTINGS}
    return EngineConfig(device=args.device, **settings, **engine_config_fields(args)), group
