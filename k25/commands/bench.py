"""`k25 bench ...`: benchmarks that print figures, each side by side with its reference."""

import argparse
import json
import sys

from engine.hardware.chunk_choice import LATENCY_TOLERANCE, THROUGHPUT_TOLERANCE
from k25.commands.engine_settings import add_engine_settings, load_for_engine


def register(subparsers) -> None:
    bench = subparsers.add_parser("bench", help="run a benchmark", description="Benchmarks that print measured figures.")
    kinds = bench.add_subparsers(dest="bench", metavar="KIND", required=True)
    p = kinds.add_parser(
        "engine",
        help="the engine vs transformers generate() on a serving-like workload",
        description="All requests are submitted at once; transformers runs one at a time and in static padded batches.",
    )
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, nargs=2, default=[32, 1024], metavar=("MIN", "MAX"))
    p.add_argument("--max-tokens", type=int, nargs=2, default=[16, 256], metavar=("MIN", "MAX"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reference-batch-sizes", type=int, nargs="+", default=[1, 8, 32], help="transformers batch sizes to try; the best counts")
    p.add_argument("--chunk-size", type=int, default=256)
    p.add_argument("--decode-context", type=int, default=512,
                   help="context tokens of the batch-1 decode steps measured against the memory bandwidth (default 512)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    add_engine_settings(p)
    p.set_defaults(handler=run_engine_bench)

    p = kinds.add_parser(
        "load",
        help="model load time: our loader vs transformers on the same GGUF file",
        description="Loads the model in fresh processes, best of --repeats, ours and transformers' side by side.",
    )
    p.add_argument("--model", default="smollm2-135m", help="a model name or .gguf path")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=run_load_bench)

    p = kinds.add_parser(
        "chunk",
        help="the chunker's speed and clause split rate vs fixed token windows",
        description="MB/s and chunks/s with the tokenizer included (best of --repeats), and the share of clauses "
        "(non-empty lines) that no single chunk holds, for fixed windows and for the chunker, side by side.",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="UTF-8 documents, e.g. tests/fixtures/contracts/*.txt")
    p.add_argument("--model", default="smollm2-135m", help="whose tokenizer counts the tokens")
    p.add_argument("--chunk-size", type=int, default=512, help="chunk size of the speed measurement (default 512)")
    p.add_argument("--split-chunk-sizes", type=int, nargs="+", default=[128, 256, 512, 1024], help="chunk sizes of the split rate table")
    p.add_argument("--overlap-ratio", type=float, default=0.1)
    p.add_argument("--semantic-threshold", type=float, default=0.5)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(handler=run_chunk_bench)

    p = kinds.add_parser(
        "serve",
        help="load a running gateway: Poisson arrivals, TTFT / inter-token / end-to-end latency",
        description="Streamed completions against a gateway (e.g. `k25 up --model tiny-random`), in one of three modes: "
        "open-loop Poisson arrivals at --qps for --duration seconds; --sweep over several QPS levels, printing the "
        "highest one held at p99 TTFT under --ttft-limit-ms; or --concurrency-probe N streams opened at once.",
    )
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the gateway (default http://127.0.0.1:8000)")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--qps", type=float, help="mean request rate of the Poisson arrivals")
    mode.add_argument("--sweep", metavar="Q1,Q2,...", help="run each of these QPS levels for --duration seconds")
    mode.add_argument("--concurrency-probe", type=int, metavar="N", help="open N streams at once")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals per QPS level (default 30)")
    p.add_argument("--model", default=None, help="the model to ask for (default: the first the gateway serves)")
    p.add_argument("--prompt-tokens", type=int, nargs=2, default=[32, 256], metavar=("MIN", "MAX"), help="prompt length range (default 32 256)")
    p.add_argument("--max-tokens", type=int, nargs=2, default=[16, 64], metavar=("MIN", "MAX"), help="max_tokens range (default 16 64)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a request may take (default 300)")
    p.add_argument("--ttft-limit-ms", type=float, default=100.0, help="the p99 TTFT a sweep level must stay under (default 100)")
    p.add_argument("--documents", type=int, metavar="D",
                   help="document QA (with --qps): D documents, --questions about each, every prompt a whole document "
                   "and then a question of --prompt-tokens tokens; reports the share of prompt tokens served from cache")
    p.add_argument("--structured", choices=["json", "tools", "free"],
                   help="chat requests of a structured workload instead of token-id prompts: a mix of JSON schemas "
                   "(json), of tool calls with tool_choice required (tools), or the json questions unconstrained "
                   "(free, the baseline); reports the share of answers that validate")
    p.add_argument("--stored-documents", nargs="+", metavar="FILE",
                   help="document QA by id (with --qps): each FILE uploaded once (POST /v1/documents), then --questions "
                   "questions about each asked through /v1/documents/ask, interleaved; reports each question's latency "
                   "(a document's first apart from the later ones), the passages it read and the prompt tokens found "
                   "cached; the documents are deleted after")
    p.add_argument("--questions-file", metavar="FILE",
                   help="the questions of --stored-documents per file name, as tests/fixtures/contracts/questions.json "
                   "(default: a contract review's usual questions)")
    p.add_argument("--passages", type=int, help="passages each --stored-documents question reads (default: the gateway's)")
    p.add_argument("--warm", action="store_true", help="upload the --stored-documents with their KV warmed")
    p.add_argument("--read", choices=("auto", "together", "notes"),
                   help="how each --stored-documents question reads its passages (default: the gateway's, auto)")
    p.add_argument("--questions", type=int, default=4, metavar="Q", help="questions per document (default 4)")
    p.add_argument("--document-tokens", type=int, default=2000, help="tokens per document (default 2000)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--plot", metavar="FILE", help="write a PNG of the latencies (or of the sweep)")
    p.add_argument("--cpu-of", action="append", default=[], metavar="NAME=PID",
                   help="also report the CPU time per completed request of process PID (its own threads, not its "
                   "children) under NAME, e.g. gateway=1234; repeatable; Linux (/proc) only")
    p.set_defaults(handler=run_serve_bench)
    register_prefix_index(kinds)
    register_quant(kinds)
    register_profile(kinds)
    register_gpu(kinds)


def register_gpu(kinds) -> None:
    p = kinds.add_parser(
        "gpu",
        help="every GPU figure the engines owe, in one run of at most 8 minutes, into one JSON file",
        description="On a CUDA device, each section in a process of its own under its time budget, one that fails "
        "recording why: CUDA-graph decode replay against eager, token for token; the Triton paged-attention kernel "
        "against torch's SDPA; decode step time at batch 1, 16 and 128 against the HBM bandwidth limit; and `k25 bench "
        "serve` (64 streams) through `k25 up --backend k25` and `--backend vllm` (skipped where vLLM is not installed). "
        "The file also names the device, the torch, CUDA and Triton versions, the commit and each section's wall time.",
    )
    p.add_argument("--out", required=True, metavar="FILE.json", help="where the report is written (after each section)")
    p.add_argument("--allow-cpu", action="store_true",
                   help="without a CUDA device, run each section on the CPU in a reduced size, on the tiny random model, so "
                   "that its code runs (no figure of such a run is a GPU's); without it, such a run measures nothing")
    p.add_argument("--quick", action="store_true", help="fewer and shorter measurements on the GPU: a first look in about "
                   "half the time")
    p.add_argument("--model", default=None, help="the model of a CUDA run: a name or a .gguf path (default smollm2-135m)")
    p.add_argument("--git-commit", default=None, metavar="SHA",
                   help="the commit the tree is, recorded where it is no git checkout (default: git rev-parse HEAD)")
    p.set_defaults(handler=run_gpu_bench)


def run_gpu_bench(args: argparse.Namespace) -> int:
    from bench.gpu_check import run_check
    from engine.base.errors import EngineConfigError
    from k25.commands.engine_backend import vllm_python

    try:
        vllm_python()
        vllm_missing = None
    except EngineConfigError:
        vllm_missing = "neither this Python nor the checkout's .venv-vllm has vllm"
    report = run_check(args.out, args.allow_cpu, args.quick, args.model, vllm_missing, args.git_commit,
                       progress=lambda m: print(f"k25 bench gpu: {m}", file=sys.stderr))
    print(f"k25 bench gpu: wrote {args.out}", file=sys.stderr)
    statuses = [section["status"] for section in report["sections"].values()]
    return 1 if "error" in statuses or all(status == "skipped" for status in statuses) else 0


def register_profile(kinds) -> None:
    p = kinds.add_parser(
        "profile",
        help="the hardware profile: memory per chunk, what fits, and throughput / p95 at each max_chunk_per_gpu",
        description="On the device it runs on: the weights, activations and KV bytes a chunk that the engine counts at "
        "start, the largest max_chunk_per_gpu that fits, then the engine (in process) run on one workload at each "
        "candidate max_chunk_per_gpu: generated tokens/s and p95 request latency (arrival to finish). It recommends "
        "the smallest value whose throughput is within --throughput-tolerance of the best and whose p95 is within "
        "--latency-tolerance of the best (if none is within both, the smallest within the throughput tolerance).",
    )
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--chunk-size", type=int, default=256, help="tokens a chunk (default 256)")
    p.add_argument("--lengths", default="short", metavar="DIST",
                   help="chunks a request fills, prompt and output: short (1), documents (5, 6 or 7) or chunk counts "
                   "such as 1,2,6, drawn uniformly (default short)")
    p.add_argument("--requests", type=int, default=32, help="requests a candidate (default 32)")
    p.add_argument("--max-tokens", type=int, default=16, help="tokens each request generates (default 16)")
    p.add_argument("--qps", type=float, default=None, help="Poisson arrivals at this mean rate (default: all at once)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=2,
                   help="times each candidate is run, in turn; its run with the highest throughput counts (default 2)")
    p.add_argument("--candidates", default=None, metavar="N,N,...",
                   help="max_chunk_per_gpu values to measure (default 1, 2, 4, 6, 8, 12, 16, ... from the longest "
                   "request up to what holds every request the engine may run at once, or what fits)")
    p.add_argument("--throughput-tolerance", type=float, default=THROUGHPUT_TOLERANCE,
                   help=f"how far below the best throughput the recommendation may be (default {THROUGHPUT_TOLERANCE})")
    p.add_argument("--latency-tolerance", type=float, default=LATENCY_TOLERANCE,
                   help=f"how far above the best p95 the recommendation may be (default {LATENCY_TOLERANCE})")
    p.add_argument("--plot", metavar="FILE", help="write a PNG of the curve")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    add_engine_settings(p)
    p.set_defaults(handler=run_profile_bench)


def run_profile_bench(args: argparse.Namespace) -> int:
    from bench.profile_command import run_command

    return run_command(args, lambda: load_for_engine(args, chunk_size=args.chunk_size))


def register_quant(kinds) -> None:
    p = kinds.add_parser(
        "quant",
        help="weight quantization: KL per layer type and width, the presets' bytes and decode speed vs bf16",
        description="Teacher-forced KL (nats/token) against the unquantised bf16 model over a fixed text set, for each "
        "layer type at each width alone and for each preset; the presets' perplexity, weight bytes a decode step "
        "reads and decode tokens/s at each --batches, side by side with the unquantised engine in the same run.",
    )
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--texts", nargs="+", metavar="FILE", default=None,
                   help="UTF-8 texts (default: the repository's English and Chinese contracts, tests/fixtures/contracts)")
    p.add_argument("--tokens-per-text", type=int, default=256, help="each text's first N tokens are scored (default 256)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 32], help="decode batch sizes (default 1 32)")
    p.add_argument("--decode-context", type=int, default=128, help="prompt tokens of each decoding sequence (default 128)")
    p.add_argument("--decode-steps", type=int, default=16, help="decode steps timed, the median counts (default 16)")
    p.add_argument("--rounds", type=int, default=2,
                   help="times each engine's decode is measured, in turn; the best counts (default 2)")
    p.add_argument("--kl-budget", type=float, default=None, metavar="NATS",
                   help="also recommend the spec that reads the fewest bytes with a measured mean KL within NATS")
    p.add_argument("--plot", metavar="FILE", help="write a PNG of the table")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(handler=run_quant_bench)


def run_quant_bench(args: argparse.Namespace) -> int:
    import torch

    from bench.quant_bench import DEFAULT_TEXTS, bench_quant
    from common.model_source import ModelLoadError
    from engine.model.loader import load_model

    paths = args.texts or [str(p) for p in DEFAULT_TEXTS]
    try:
        if not paths:
            raise ValueError("no texts: pass --texts FILE ...")
        if min(args.tokens_per_text, args.decode_context, args.decode_steps, args.rounds, *args.batches) < 1:
            raise ValueError("--tokens-per-text, --decode-context, --decode-steps, --rounds and --batches must be at least 1")
        if args.kl_budget is not None and args.kl_budget < 0:
            raise ValueError(f"--kl-budget must be at least 0, got {args.kl_budget}")
        loaded = load_model(args.model, torch.bfloat16)
        texts = [loaded.tokenizer.encode(open(path, encoding="utf-8").read())[: args.tokens_per_text] for path in paths]
    except (ValueError, OSError, ModelLoadError) as exc:
        print(f"k25 bench quant: {exc}", file=sys.stderr)
        return 2
    result = bench_quant(loaded, texts, paths, tuple(args.batches), args.decode_context, args.decode_steps, args.rounds,
                         args.kl_budget, progress=lambda m: print(m, file=sys.stderr))
    if args.plot:
        from bench.quant_plot import plot_quant

        plot_quant(result, args.plot)
    if args.json:
        print(json.dumps(result.as_dict()))
        return 0
    print(f"texts          {len(paths)} files, first {args.tokens_per_text} tokens each: {result.positions} positions, "
          f"teacher-forced; KL(bf16 || quantised) in nats/token")
    print("one layer type quantised (the rest bf16):")
    print("  type   width       mean KL   top-1   MB read a decode step (bf16)")
    for r in result.layers:
        print(f"  {r.layer_type:6s} {r.width:10s} {r.mean_kl:8.4f} {r.top1_agreement:7.3f}   "
              f"{r.bytes_read / 1e6:8.3f} ({r.bf16_bytes_read / 1e6:.3f})")
    baseline = result.specs[0]
    batches = sorted(baseline.tokens_per_s)
    print(f"whole model (decode: {result.decode_context} tokens of context, best of {args.rounds} rounds, same run):")
    print("  name         mean KL  budget    ppl   top-1  MB read (x fewer)  MB held  "
          + "  ".join(f"b{b} tok/s (x bf16)" for b in batches))
    for row in result.specs + ([result.recommended] if result.recommended else []):
        budget = "-" if row.kl_budget is None else f"{row.kl_budget:.3f}"
        speeds = "  ".join(f"{row.tokens_per_s[b]:8.1f} ({row.ratio(baseline, b):4.2f}x)" for b in batches)
        print(f"  {row.name:11s} {row.mean_kl:8.4f} {budget:>7s} {row.perplexity:6.2f} {row.top1_agreement:6.3f} "
              f"{row.bytes_read / 1e6:8.1f} ({baseline.bytes_read / row.bytes_read:4.2f}x) {row.memory_bytes / 1e6:8.1f}  {speeds}")
        if row.name != "bf16":
            print(f"               {row.spec}")
    if result.kl_budget is not None:
        print(f"recommended within KL {result.kl_budget}: "
              + (f"--quant {result.recommended.spec} ({result.recommendation_note})" if result.recommended else result.recommendation_note))
    return 0


def register_prefix_index(kinds) -> None:
    p = kinds.add_parser(
        "prefix-index",
        help="the gateway's cache-aware routing index: memory per block, lookup and announcement time",
        description="Fill the index with distinct block hashes announced by engines (as KV events) and report its memory "
        "(tracemalloc), the time of a lookup, of an announcement and of forgetting an engine.",
    )
    p.add_argument("--blocks", type=int, default=1_000_000, help="distinct block hashes announced (default 1000000)")
    p.add_argument("--max-blocks", type=int, default=1_000_000, help="the index's bound (default 1000000)")
    p.add_argument("--engines", type=int, default=4, help="engines announcing, in turn (default 4)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(handler=run_prefix_index_bench)


def run_prefix_index_bench(args: argparse.Namespace) -> int:
    from bench.prefix_index_bench import bench_prefix_index

    if min(args.blocks, args.max_blocks, args.engines) < 1 or args.engines > 1000:
        print("k25 bench prefix-index: --blocks, --max-blocks and --engines must be at least 1 (and --engines at most 1000)",
              file=sys.stderr)
        return 2
    r = bench_prefix_index(args.blocks, args.max_blocks, args.engines)
    if args.json:
        print(json.dumps(r.as_dict()))
        return 0
    print(f"index          {r.held_blocks:,} blocks held of {r.announced_blocks:,} announced by {r.engines} engines "
          f"(bound {r.max_blocks:,}, {r.evicted_blocks:,} evicted)")
    print(f"memory         {r.memory_bytes / 2**20:.1f} MiB ({r.bytes_per_block:.0f} bytes a block)")
    print(f"announce       {r.apply_us_per_hash:.2f} us a hash")
    print(f"lookup         {r.lookup_us:.0f} us for a 256-block prompt (median)")
    print(f"forget engine  {r.forget_ms:.2f} ms, then a sweep of {r.sweep_ms:.0f} ms in slices")
    return 0


def run_engine_bench(args: argparse.Namespace) -> int:
    from bench.engine_bench import bench_engine, make_workload

    model, config = load_for_engine(args, chunk_size=args.chunk_size)
    workload = make_workload(model.config.vocab_size, args.requests, tuple(args.prompt_tokens), tuple(args.max_tokens), args.seed)
    result = bench_engine(model, workload, config, args.reference_batch_sizes, progress=lambda m: print(m, file=sys.stderr),
                          decode_context=args.decode_context)
    if args.json:
        print(json.dumps(result.as_dict()))
        return 0
    print(f"workload       {result.requests} requests, {result.prompt_tokens} prompt + {result.generated_tokens} generated tokens")
    print(f"engine         {result.engine_tokens_per_s:8.1f} generated tok/s  ({result.engine_seconds:.1f} s, {result.dtype})")
    for mode, tps in result.reference_tokens_per_s_by_mode.items():
        print(f"transformers   {tps:8.1f} generated tok/s  ({mode}, {result.reference_dtype})")
    print(f"ratio          {result.ratio:8.2f}x  (engine / best transformers mode, {result.reference_best_mode})")
    print(
        f"roofline       {result.roofline_fraction:8.2f}  (engine {result.engine_flops_per_s / 1e9:.1f} GFLOP/s "
        f"of a {result.matmul_peak_flops_per_s / 1e9:.1f} GFLOP/s {result.dtype} matmul peak through the engine's projection)"
    )
    print(
        f"decode, batch 1 {result.decode_step_seconds * 1e3:7.2f} ms a step at {result.decode_context_tokens} tokens of context: "
        f"{result.decode_step_over_bandwidth_limit:.2f}x the bandwidth limit ({result.decode_bytes_read / 1e6:.0f} MB read "
        f"at {result.memory_bandwidth_bytes_per_s / 1e9:.1f} GB/s)"
    )
    return 0


def run_load_bench(args: argparse.Namespace) -> int:
    from bench.engine_bench import bench_load

    result = bench_load(args.model, args.repeats)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"k25 loader     {result['k25_seconds']:6.2f} s  (best of {args.repeats}, fresh process each)")
    print(f"transformers   {result['transformers_seconds']:6.2f} s  (AutoModelForCausalLM.from_pretrained(gguf_file=...), fp32)")
    print(f"ratio          {result['ratio']:6.1f}x faster")
    return 0


def run_chunk_bench(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from bench.chunker_bench import bench_chunker
    from common.model_source import ModelLoadError
    from common.tokenizer import load_tokenizer
    from k25.commands.chunk import read_text
    from services.chunker.boundaries import ChunkParams

    try:
        if args.repeats < 1:
            raise ValueError(f"--repeats must be at least 1, got {args.repeats}")
        params = [ChunkParams(size, args.overlap_ratio, args.semantic_threshold) for size in (args.chunk_size, *args.split_chunk_sizes)]
        texts = [read_text(path) for path in args.files]
        tokenizer = load_tokenizer(args.model)
    except (ValueError, ModelLoadError) as exc:
        print(f"k25 bench chunk: {exc}", file=sys.stderr)
        return 2
    with tqdm(total=2 * args.repeats + len(args.split_chunk_sizes), desc="bench chunk", file=sys.stderr) as bar:
        result = bench_chunker(tokenizer, texts, params[0], args.split_chunk_sizes, args.repeats, tick=bar.update)
    if args.json:
        print(json.dumps(result.as_dict()))
        return 0
    print(f"documents      {result.documents} files, {result.characters:,} characters, {result.utf8_bytes:,} UTF-8 bytes, "
          f"{result.tokens:,} tokens ({args.model})")
    print(f"speed          chunk {args.chunk_size}, overlap {args.overlap_ratio}, tokenizer included, best of {args.repeats}")
    for name, speed in (("k25 chunker", result.k25_speed), ("fixed window", result.fixed_speed)):
        print(f"  {name:13s}{speed.mb_per_s:8.2f} MB/s {speed.chunks_per_s:10.0f} chunks/s")
    print("clause split rate (clauses no chunk holds whole; a clause is a non-empty line)")
    print("  chunk   clauses        all: fixed     k25    fitting: fixed     k25    chunks: fixed   k25")
    for r in result.split_rates:
        print(f"  {r.chunk_size:5d} {r.clauses:5d} ({r.clauses_that_fit:4d} fit) {r.fixed_split_rate:10.1%} {r.k25_split_rate:7.1%}"
              f" {r.fixed_split_rate_of_fitting:14.1%} {r.k25_split_rate_of_fitting:7.1%} {r.fixed_chunks:13d} {r.k25_chunks:5d}")
    return 0


def run_serve_bench(args: argparse.Namespace) -> int:
    from bench.serve import run_command

    return run_command(args)
