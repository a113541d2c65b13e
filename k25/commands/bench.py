"""`k25 bench ...`: benchmarks that print figures, each side by side with its reference."""

import argparse
import json
import sys


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
    p.add_argument("--max-num-batched-tokens", type=int, default=512, help="the engine's token budget per step")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
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


def run_engine_bench(args: argparse.Namespace) -> int:
    from engine.bench import bench_engine, make_workload
    from engine.config import EngineConfig
    from engine.loader import load_model

    model = load_model(args.model)
    workload = make_workload(model.config.vocab_size, args.requests, tuple(args.prompt_tokens), tuple(args.max_tokens), args.seed)
    config = EngineConfig(chunk_size=args.chunk_size, max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs)
    result = bench_engine(model, workload, config, args.reference_batch_sizes, progress=lambda m: print(m, file=sys.stderr))
    if args.json:
        print(json.dumps(result.as_dict()))
        return 0
    print(f"workload       {result.requests} requests, {result.prompt_tokens} prompt + {result.generated_tokens} generated tokens")
    print(f"engine         {result.engine_tokens_per_s:8.1f} generated tok/s  ({result.engine_seconds:.1f} s)")
    for mode, tps in result.reference_tokens_per_s_by_mode.items():
        print(f"transformers   {tps:8.1f} generated tok/s  ({mode})")
    print(f"ratio          {result.ratio:8.2f}x  (engine / best transformers mode, {result.reference_best_mode})")
    print(
        f"roofline       {result.roofline_fraction:8.2f}  (engine {result.engine_flops_per_s / 1e9:.1f} GFLOP/s "
        f"of a {result.matmul_peak_flops_per_s / 1e9:.1f} GFLOP/s fp32 matmul peak)"
    )
    return 0


def run_load_bench(args: argparse.Namespace) -> int:
    from engine.bench import bench_load

    result = bench_load(args.model, args.repeats)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"k25 loader     {result['k25_seconds']:6.2f} s  (best of {args.repeats}, fresh process each)")
    print(f"transformers   {result['transformers_seconds']:6.2f} s  (AutoModelForCausalLM.from_pretrained(gguf_file=...), fp32)")
    print(f"ratio          {result['ratio']:6.1f}x faster")
    return 0
