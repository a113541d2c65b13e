"""`k25 bench profile`: check the flags, load the model as `k25 engine` does, measure the
curve, then print it (a table, or one JSON object) with the recommendation and draw the plot."""

import json
import os
import sys
from collections.abc import Callable

from bench.profile_workload import default_candidates, make_requests, parse_candidates, parse_lengths


def run_command(args, load_for_engine: Callable[[], tuple]) -> int:
    """`load_for_engine()`: the model and EngineConfig, as `k25 engine` loads them from the flags."""
    from tqdm import tqdm

    from bench.profile_run import engine_memory, profile
    from common.model_source import ModelLoadError
    from engine.base.errors import EngineConfigError

    try:
        lengths = parse_lengths(args.lengths)
        wanted = parse_candidates(args.candidates) if args.candidates else None
        _check_numbers(args)
        model, config = load_for_engine()
        longest = max(lengths) * args.chunk_size
        if longest > model.config.max_position_embeddings:
            raise ValueError(f"--lengths: a request of {max(lengths)} chunks of {args.chunk_size} tokens is longer than "
                             f"the model's {model.config.max_position_embeddings} positions")
        requests = make_requests(model.config.vocab_size, args.chunk_size, lengths, args.requests, args.max_tokens,
                                 args.qps, args.seed)
        plan = engine_memory(model, config)
        candidates = _candidates(wanted, max(lengths), plan.largest_max_chunk_per_gpu,
                                 min(args.requests, config.max_num_seqs) * max(lengths))
    except (ValueError, ModelLoadError, EngineConfigError) as exc:
        print(f"k25 bench profile: {exc}", file=sys.stderr)
        return 2
    with tqdm(total=args.rounds * len(candidates) * len(requests), desc="bench profile", unit="req", file=sys.stderr) as bar:
        result = profile(model, config, requests, candidates, plan, args.throughput_tolerance, args.latency_tolerance,
                         args.rounds, tick=bar.update)
    title = _workload_title(args, lengths)
    if args.plot:
        from bench.profile_plot import plot_profile

        plot_profile(result, title, args.plot)
    if args.json:
        print(json.dumps({**result.as_dict(), "workload": title, "lengths": list(lengths), "requests": args.requests,
                          "max_tokens": args.max_tokens, "qps": args.qps, "seed": args.seed}))
        return 0
    print("\n".join(report_lines(result, title)))
    return 0


def _check_numbers(args) -> None:
    if args.requests < 1:
        raise ValueError(f"--requests must be at least 1, got {args.requests}")
    if args.rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {args.rounds}")
    if args.chunk_size < 1:
        raise ValueError(f"--chunk-size must be at least 1, got {args.chunk_size}")
    if args.qps is not None and not args.qps > 0:
        raise ValueError(f"--qps must be positive, got {args.qps}")
    for name in ("throughput_tolerance", "latency_tolerance"):
        if not 0 <= getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be in [0, 1), got {getattr(args, name)}")
    if args.plot and not os.path.isdir(os.path.dirname(os.path.abspath(args.plot))):
        raise ValueError(f"--plot: no folder {os.path.dirname(os.path.abspath(args.plot))}")


def _candidates(wanted: tuple[int, ...] | None, longest_chunks: int, largest: int, all_at_once: int) -> tuple[int, ...]:
    """The values to measure: --candidates, or the ladder from the longest request up to the
    value that holds every request the engine may run at once (more would be idle) or what fits."""
    if largest < longest_chunks:
        raise ValueError(f"a request of {longest_chunks} chunks does not fit: the largest max_chunk_per_gpu that fits "
                         f"is {largest}")
    if wanted is None:
        return default_candidates(longest_chunks, min(largest, max(all_at_once, longest_chunks)))
    if wanted[-1] > largest:
        raise ValueError(f"--candidates: {wanted[-1]} does not fit; the largest max_chunk_per_gpu that fits is {largest}")
    if wanted[0] < longest_chunks:
        raise ValueError(f"--candidates: {wanted[0]} cannot hold the longest request ({longest_chunks} chunks)")
    return wanted


def _workload_title(args, lengths: tuple[int, ...]) -> str:
    arrivals = f"Poisson at {args.qps:g} req/s" if args.qps else "all at once"
    return (f"{args.requests} requests of {'/'.join(map(str, lengths))} chunks of {args.chunk_size} tokens "
            f"(prompt + {args.max_tokens} generated), {arrivals}, seed {args.seed}; best of {args.rounds} rounds")


def report_lines(result, title: str) -> list[str]:
    plan, mib = result.plan, 2**20
    lines = [
        f"device         {result.device}, {result.dtype}, chunk {result.chunk_size} tokens",
        f"memory         budget {plan.budget_bytes / mib:,.1f} MiB = weights {plan.weight_bytes / mib:,.1f} MiB + "
        f"activations {plan.activation_bytes / mib:,.1f} MiB + KV {plan.chunk_kv_bytes / mib:,.2f} MiB a chunk x N",
        f"largest fit    max_chunk_per_gpu {result.largest}",
        f"workload       {title}",
        "  max_chunk_per_gpu   gen tok/s   p50 s   p95 s   preemptions",
    ]
    for m in result.measured:
        mark = "  <- recommended" if m.max_chunk_per_gpu == result.recommended.value else ""
        lines.append(f"  {m.max_chunk_per_gpu:17d} {m.tokens_per_s:11.1f} {m.p50_latency_s:7.2f} {m.p95_latency_s:7.2f} "
                     f"{m.preemptions:13d}{mark}")
    lines.append(f"recommended    --max-chunk-per-gpu {result.recommended.value}")
    lines.append(f"why            {result.recommended.reason}")
    return lines
