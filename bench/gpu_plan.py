"""What `k25 bench gpu` measures and how big: each section's function, its arguments and its time
budget. On CUDA the sizes are those of the figures the engines owe; off CUDA (--allow-cpu) the
same code runs in the smallest size, on the tiny random model, so that every path is exercised
where no GPU is: no figure of such a run is a GPU's."""

from dataclasses import dataclass, field

# the whole run: a lent GPU's 15 minutes include its start and the transfers, and it must end in 8
GPU_TOTAL_BUDGET_S = 420.0
CPU_TOTAL_BUDGET_S = 900.0
# `k25 bench serve`'s workload of the vLLM comparison (docs/benchmarks/index.md)
SERVE_WORKLOAD = ["--concurrency-probe", "64", "--prompt-tokens", "128", "512", "--max-tokens", "64", "64", "--seed", "1"]
QUICK_SERVE_WORKLOAD = ["--concurrency-probe", "16", "--prompt-tokens", "128", "512", "--max-tokens", "16", "16", "--seed", "1"]
CPU_SERVE_WORKLOAD = ["--concurrency-probe", "4", "--prompt-tokens", "8", "16", "--max-tokens", "4", "4", "--seed", "1"]
# SmolLM2-135M's attention: 9 query heads over 3 KV heads of 64; the engine's 16-token blocks
SMOLLM2_ATTENTION = {"heads": 9, "kv_heads": 3, "head_dim": 64, "block_size": 16}
# (query rows, context tokens) a sequence: decodes at several contexts, a prefill slice over cached
# context that starts mid-block, a whole prompt, a later chunk of a long prompt
MIXED = [[1, 1], [40, 61], [45, 45], [1, 37], [70, 170], [1, 200]]
GPU_ATTENTION_SHAPES = {
    "mixed": MIXED,
    "long decodes (keys split into runs)": [[1, 4000], [1, 1500], [1, 40]],
    "128 decodes of 512": [[1, 512]] * 128,
    "a 2048-token prompt": [[2048, 2048]],
}
CPU_ATTENTION_SHAPES = {"mixed": [[1, 1], [5, 9], [1, 37]]}


@dataclass(frozen=True)
class Section:
    name: str
    target: str  # "module:function", called with `params` in a process of its own
    params: dict
    budget_s: float
    env: dict = field(default_factory=dict)  # added to that process's environment
    skipped: str | None = None  # why it does not run, where it does not


@dataclass(frozen=True)
class Plan:
    sections: list[Section]
    total_budget_s: float


def _attention_cases(shapes: dict, dtypes: tuple[str, ...]) -> list[dict]:
    return [{"name": f"{name}, {dtype}", "specs": specs, "dtype": dtype, **SMOLLM2_ATTENTION}
            for dtype in dtypes for name, specs in shapes.items()]


def gpu_plan(quick: bool, model: str | None, vllm_missing: str | None) -> Plan:
    """The run on CUDA; `quick`: fewer and shorter of each; `vllm_missing`: why the vLLM backend
    cannot run here, if it cannot."""
    model = model or "smollm2-135m"
    serve = QUICK_SERVE_WORKLOAD if quick else SERVE_WORKLOAD
    shapes = {"mixed": MIXED} if quick else GPU_ATTENTION_SHAPES

    def served_by(backend: str, budget_s: float, skipped: str | None = None) -> Section:
        params = dict(backend=backend, model=model, engine_flags=["--device=cuda"], serve_flags=serve,
                      startup_timeout_s=budget_s - 30)
        return Section(f"serve_{backend}", "bench.backend_serve:serve_backend", params, budget_s, skipped=skipped)

    return Plan([
        Section("graph_replay", "bench.graph_replay_check:graph_replay_check",
                dict(model=model, device="cuda", dtype="bfloat16", prompts=3 if quick else 6, prompt_tokens=[5, 300],
                     max_tokens=[8, 16] if quick else [16, 64], chunk_size=256), 75),
        Section("attention", "bench.attention_check:attention_check",
                dict(cases=_attention_cases(shapes, ("float32", "float16", "bfloat16")), device="cuda"), 75),
        Section("decode_roofline", "bench.decode_roofline:decode_roofline",
                dict(model=model, device="cuda", dtype="bfloat16", batches=[1, 16] if quick else [1, 16, 128], context=512,
                     steps=8 if quick else 32, chunk_size=256, bandwidth_bytes=1 << 30), 75),
        served_by("k25", 120),
        served_by("vllm", 150, skipped=f"vLLM not installed ({vllm_missing})" if vllm_missing else None),
        # last: what time the comparison with vLLM leaves; float32, where restored and recomputed KV agree
        Section("kv_tiers", "bench.kv_tier_check:kv_tier_check",
                dict(model=model, device="cuda", dtype="float32", documents=6, doc_tokens=900 if quick else 1800,
                     rounds=3, device_chunks=8 if quick else 16, chunk_size=256), 60),
    ], GPU_TOTAL_BUDGET_S)


def cpu_plan() -> Plan:
    """The same sections on the CPU in the smallest size: the tiny random model, the Triton
    kernel under its interpreter, the k25 backend only."""
    return Plan([
        Section("graph_replay", "bench.graph_replay_check:graph_replay_check",
                dict(model="tiny-random", device="cpu", dtype="float32", prompts=3, prompt_tokens=[3, 20], max_tokens=[4, 8],
                     chunk_size=32), 300),
        Section("attention", "bench.attention_check:attention_check",
                dict(cases=_attention_cases(CPU_ATTENTION_SHAPES, ("float32", "float16", "bfloat16")), device="cpu"), 300,
                env={"TRITON_INTERPRET": "1"}),
        Section("decode_roofline", "bench.decode_roofline:decode_roofline",
                dict(model="tiny-random", device="cpu", dtype="float32", batches=[1, 4], context=32, steps=4, chunk_size=32,
                     bandwidth_bytes=1 << 24), 300),
        Section("serve_k25", "bench.backend_serve:serve_backend",
                dict(backend="k25", model="tiny-random", serve_flags=CPU_SERVE_WORKLOAD, startup_timeout_s=240,
                     # the KV its streams need, no host tier: by default a CPU engine takes gigabytes
                     engine_flags=["--device=cpu", "--max-chunk-per-gpu=8", "--kv-host-tier-gib=0"]), 300),
        Section("serve_vllm", "bench.backend_serve:serve_backend", {}, 0,
                skipped="a CPU run measures the k25 backend only (the vLLM backend is compared on a GPU)"),
        Section("kv_tiers", "bench.kv_tier_check:kv_tier_check",
                dict(model="tiny-random", device="cpu", dtype="float32", documents=3, doc_tokens=60, rounds=2,
                     device_chunks=4, chunk_size=32), 300),
    ], CPU_TOTAL_BUDGET_S)
