"""`k25 bench engine`: the engine against transformers `generate()` on one serving-like
workload, in the same run, with two physical limits measured in that run: this machine's
matmul peak through the engine's own projection in the engine's dtype (what a compute-bound
step could reach) and its memory bandwidth (what a decode step at batch 1, which reads every
weight once, could reach). transformers runs in its own best dtype on this CPU."""

import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

import torch
from tqdm import tqdm

from bench.quant_bytes import decode_weight_bytes
from engine.attention.kv_cache import kv_bytes_per_token
from engine.base.config import EngineConfig
from engine.core.sampling_params import SamplingParams
from engine.kernels.cpu_build import cpu_flags
from engine.llm_engine import LLMEngine
from engine.model.linear import Weight
from engine.model.llama import LlamaModel
from engine.model.loader import LoadedModel
from engine.offline import generate, make_request


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]
    max_tokens: list[int]

    @property
    def prompt_tokens(self) -> int:
        return sum(map(len, self.prompts))

    @property
    def generated_tokens(self) -> int:
        return sum(self.max_tokens)


def random_prompt(rng: random.Random, vocab_size: int, length: int) -> list[int]:
    low_id = min(1000, vocab_size // 2)  # skip the special tokens at the start of the vocabulary
    return [rng.randrange(low_id, vocab_size) for _ in range(length)]


def make_workload(vocab_size: int, num_requests: int, prompt_range: tuple[int, int], max_tokens_range: tuple[int, int], seed: int) -> Workload:
    rng = random.Random(seed)
    prompts = [random_prompt(rng, vocab_size, rng.randint(*prompt_range)) for _ in range(num_requests)]
    return Workload(prompts, [rng.randint(*max_tokens_range) for _ in range(num_requests)])


def matmul_peak_flops(dtype: torch.dtype = torch.float32, size: int = 2048, repeats: int = 5) -> float:
    """Best FLOP/s of a square matmul through the engine's own projection (engine/model/linear.py)
    in `dtype`: the kernel the engine runs for that dtype on this machine (on an AVX2-only CPU its
    bf16 path, not torch's emulated bf16 GEMM), so the roofline means the same on every machine."""
    generator = torch.Generator().manual_seed(0)
    weight = Weight(torch.randn(size, size, generator=generator).to(dtype))
    x = torch.randn(size, size, generator=generator).to(dtype)
    with torch.inference_mode():
        weight(x)  # warm up
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            weight(x)
            best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def reference_dtype(cpu_flags: set[str]) -> str:
    """transformers' own best dtype on this CPU: bfloat16 where the CPU has it natively
    (AVX512-BF16, AMX), float32 where torch would emulate bfloat16 (several times slower)."""
    return "bfloat16" if {"avx512_bf16", "amx_bf16"} & cpu_flags else "float32"


def memory_bandwidth(nbytes: int = 1 << 29, repeats: int = 5, device: str = "cpu") -> float:
    """Bytes/s of a plain large copy (read + written) on `device` (a GPU's HBM on CUDA), best of
    `repeats`: the roofline of a step that streams its weights once."""
    source = torch.empty(nbytes, dtype=torch.uint8, device=device)
    target = torch.empty(nbytes, dtype=torch.uint8, device=device)
    finish = torch.cuda.synchronize if source.is_cuda else (lambda: None)  # a CUDA copy returns before it is done
    source.fill_(1)
    target.copy_(source)  # warm up: pages touched
    finish()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        target.copy_(source)
        finish()
        best = min(best, time.perf_counter() - start)
    return 2 * nbytes / best


def decode_bytes_read(model: LlamaModel, context: int, batch: int = 1) -> int:
    """What one decode step of `batch` sequences must read: every layer's weights and the head
    once (one copy each, packed, plain or quantised; bench/quant_bytes.py), one row of the
    embedding (a row a sequence: negligible, counted once), each sequence's `context` tokens of KV."""
    return sum(decode_weight_bytes(model).values()) + batch * context * kv_bytes_per_token(model.config, model.dtype)


def decode_step_seconds(model: LoadedModel, config: EngineConfig, context: int, steps: int, batch: int = 1) -> tuple[float, int]:
    """Median seconds of a decode step of `batch` requests with `context` prompt tokens each (all
    different), over `steps` steps once every one is decoding; and the bytes such a step reads."""
    engine = LLMEngine(model, config)
    low = min(1000, model.config.vocab_size // 2)
    for b in range(batch):
        prompt = [low + (i + 7 * b) % 1000 for i in range(context)]
        engine.add_request(make_request(engine, prompt, SamplingParams(max_tokens=steps + 2, ignore_eos=True)))
    while len(engine.step().outputs) < batch:  # prefills, until a step gives every request a token
        pass
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2], decode_bytes_read(engine.runner.model, context + steps // 2, batch)


def run_engine(model: LoadedModel, workload: Workload, config: EngineConfig) -> float:
    """Seconds for the engine to finish every request, all submitted at once."""
    engine = LLMEngine(model, config)
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in workload.max_tokens]
    with tqdm(total=len(params), desc="engine", unit="req", file=sys.stderr) as bar:
        start = time.perf_counter()
        completions = generate(engine, workload.prompts, params, on_finish=lambda _: bar.update())
        elapsed = time.perf_counter() - start
    produced = sum(len(c.token_ids) for c in completions)
    if produced != workload.generated_tokens:
        raise RuntimeError(f"engine produced {produced} tokens, expected {workload.generated_tokens}")
    return elapsed


def reference_model(model: LoadedModel, dtype: torch.dtype):
    """transformers' own Llama with the very same weights, computing in `dtype`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    c = model.config
    hf_config = LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta, rope_scaling=c.rope_scaling,
        max_position_embeddings=c.max_position_embeddings, tie_word_embeddings=c.tie_word_embeddings,
    )
    reference = LlamaForCausalLM(hf_config).to(dtype).eval()
    loaded = reference.load_state_dict(model.weights, strict=False)
    if loaded.unexpected_keys or set(loaded.missing_keys) - {"lm_head.weight"}:
        raise RuntimeError(f"weights do not match transformers' Llama: {loaded}")
    if c.tie_word_embeddings:
        reference.tie_weights()
    return reference


def run_reference(reference, workload: Workload, batch_size: int, pad_token_id: int) -> float:
    """Seconds for transformers `generate()` over the workload in static, left-padded batches."""
    start = time.perf_counter()
    batches = range(0, len(workload.prompts), batch_size)
    with torch.inference_mode():
        for first in tqdm(batches, desc=f"transformers, batch {batch_size}", unit="batch", file=sys.stderr):
            prompts = workload.prompts[first : first + batch_size]
            new_tokens = max(workload.max_tokens[first : first + batch_size])
            width = max(map(len, prompts))
            ids = torch.tensor([[pad_token_id] * (width - len(p)) + p for p in prompts])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
            reference.generate(
                input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=new_tokens,
                min_new_tokens=new_tokens, pad_token_id=pad_token_id,
            )
    return time.perf_counter() - start


@dataclass
class EngineBenchResult:
    dtype: str
    reference_dtype: str  # transformers' best dtype on this CPU (reference_dtype)
    requests: int
    prompt_tokens: int
    generated_tokens: int
    parameters: int
    engine_seconds: float
    engine_tokens_per_s: float
    engine_flops_per_s: float
    matmul_peak_flops_per_s: float
    roofline_fraction: float
    reference_tokens_per_s: float
    reference_best_mode: str
    reference_tokens_per_s_by_mode: dict
    ratio: float
    decode_context_tokens: int
    decode_step_seconds: float  # batch 1, median
    decode_bytes_read: int  # weights + KV one such step reads
    memory_bandwidth_bytes_per_s: float
    decode_step_over_bandwidth_limit: float  # measured step / (bytes read / bandwidth); 1.0 is the physical limit

    def as_dict(self) -> dict:
        return asdict(self)


def bench_engine(model: LoadedModel, workload: Workload, config: EngineConfig, reference_batch_sizes: list[int],
                 progress=print, decode_context: int = 512) -> EngineBenchResult:
    params = model.config.num_parameters()
    progress(f"measuring the {config.dtype} matmul peak and the memory bandwidth")
    peak = matmul_peak_flops(getattr(torch, config.dtype))
    bandwidth = memory_bandwidth()
    progress(f"decode steps at batch 1, {decode_context} tokens of context")
    step_s, step_bytes = decode_step_seconds(model, config, decode_context, steps=32)
    progress(f"engine: {len(workload.prompts)} requests, {workload.prompt_tokens} prompt + {workload.generated_tokens} generated tokens")
    engine_s = run_engine(model, workload, config)
    by_mode = {}
    ref_dtype = reference_dtype(cpu_flags())
    reference = reference_model(model, getattr(torch, ref_dtype))
    for batch_size in reference_batch_sizes:
        mode = "one-at-a-time" if batch_size == 1 else f"static-batch-{batch_size}"
        progress(f"transformers generate() in {ref_dtype}: {mode}")
        by_mode[mode] = workload.generated_tokens / run_reference(reference, workload, batch_size, model.tokenizer.pad_token_id)
    best_mode = max(by_mode, key=by_mode.get)
    engine_tps = workload.generated_tokens / engine_s
    engine_flops = 2 * params * (workload.prompt_tokens + workload.generated_tokens) / engine_s
    return EngineBenchResult(
        dtype=config.dtype,
        reference_dtype=ref_dtype,
        requests=len(workload.prompts),
        prompt_tokens=workload.prompt_tokens,
        generated_tokens=workload.generated_tokens,
        parameters=params,
        engine_seconds=engine_s,
        engine_tokens_per_s=engine_tps,
        engine_flops_per_s=engine_flops,
        matmul_peak_flops_per_s=peak,
        roofline_fraction=engine_flops / peak,
        reference_tokens_per_s=by_mode[best_mode],
        reference_best_mode=best_mode,
        reference_tokens_per_s_by_mode=by_mode,
        ratio=engine_tps / by_mode[best_mode],
        decode_context_tokens=decode_context,
        decode_step_seconds=step_s,
        decode_bytes_read=step_bytes,
        memory_bandwidth_bytes_per_s=bandwidth,
        decode_step_over_bandwidth_limit=step_s / (step_bytes / bandwidth),
    )


_TIME_OUR_LOAD = """
import time; t = time.perf_counter()
from engine.model.loader import load_model; load_model({model!r})
print(time.perf_counter() - t)
"""

_TIME_TRANSFORMERS_LOAD = """
import os, time; t = time.perf_counter()
import torch; from transformers import AutoModelForCausalLM
from common.model_source import resolve_model
folder, name = os.path.split(resolve_model({model!r}).path)
AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
print(time.perf_counter() - t)
"""


def _seconds_in_fresh_process(script: str) -> float:
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def bench_load(model: str, repeats: int) -> dict:
    """Best-of-`repeats` load time, imports included, each in a fresh process."""
    ours = min(_seconds_in_fresh_process(_TIME_OUR_LOAD.format(model=model)) for _ in range(repeats))
    theirs = min(_seconds_in_fresh_process(_TIME_TRANSFORMERS_LOAD.format(model=model)) for _ in range(repeats))
    return {"model": model, "k25_seconds": ours, "transformers_seconds": theirs, "ratio": theirs / ours}
