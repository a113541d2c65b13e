"""Document questions on an engine whose device KV holds fewer documents than are asked about:
KV tiers on against off, in one process (`python -m bench.kv_tiers_bench`).

D documents of L tokens each are asked Q rounds of questions, round-robin, one question at a
time (each round asks every document once, so a document's KV has left the device by the time it
is asked again), each question of every side in turn so that a machine whose speed drifts weighs
on each side alike. Reports each side's TTFT p50 over the rounds after the first (the first
computes every document on every side), the time those questions took, the median of each
question's time against tiers off's for the same question, and the tokens each tier served.
With a device that holds every document (`--device-chunks` large enough) the same run measures
what the tiers cost when they are not needed.

Then the disk tier side's engine is closed (its device's cached blocks are written to disk) and a
new engine starts on the same directory, as after a restart in the same pod: each document's
first question after the restart is asked once, beside a new engine without tiers, and its TTFT
and the share of its prompt served from disk are reported."""

import argparse
import random
import statistics
import tempfile
import time

import torch

from engine.base.config import EngineConfig
from engine.core.sampling_params import SamplingParams
from engine.hardware.dtype_choice import choose_dtype, this_cpu_bf16_path
from engine.llm_engine import LLMEngine
from engine.model.loader import load_model
from engine.offline import generate

SAMPLING = SamplingParams(max_tokens=4, ignore_eos=True)


def ask(engine: LLMEngine, prompt: list[int]):
    """The request's last output, and the wall time it took."""
    started = time.perf_counter()
    return generate(engine, [prompt], SAMPLING)[0].last, time.perf_counter() - started


def run_sides(engines: dict[str, LLMEngine], docs, questions, rounds) -> dict:
    """Each question asked of every side in turn (the first side rotating), so that a machine whose
    speed drifts weighs on each side alike; a side's time is the sum of its questions'."""
    names = list(engines)
    results = {name: {"ttfts": [], "later_rounds_s": 0.0, "cached_tokens": 0, "seconds": []} for name in names}
    for r in range(rounds):
        for d, doc in enumerate(docs):
            turn = r * len(docs) + d
            for name in names[turn % len(names):] + names[: turn % len(names)]:
                out, seconds = ask(engines[name], doc + questions[(r + d) % len(questions)])
                if r:
                    result = results[name]
                    result["ttfts"].append(out.timings.time_to_first_token_s)
                    result["seconds"].append(seconds)
                    result["cached_tokens"] += out.usage.cached_tokens
    off = results[names[0]]["seconds"]
    for name, result in results.items():
        tiers = engines[name].lower_tiers
        engines[name].close()
        seconds = result.pop("seconds")
        result.update(ttft_p50_s=statistics.median(result.pop("ttfts")), later_rounds_s=sum(seconds),
                      # each question's time against the first side's for the same question, asked beside it
                      paired_time_p50=statistics.median(s / o for s, o in zip(seconds, off)),
                      host_hit_tokens=tiers.stats.host_hit_tokens - tiers.stats.disk_hit_tokens if tiers else 0,
                      disk_hit_tokens=tiers.stats.disk_hit_tokens if tiers else 0)
    return results


def after_restart(model, docs, question, config: EngineConfig, off: EngineConfig) -> dict:
    """A new engine on the disk directory an earlier one closed, beside a new engine without
    tiers: each document asked once of each, in turn."""
    restarted, cold = LLMEngine(model, config), LLMEngine(model, off)
    outs, cold_ttfts = [], []
    for doc in docs:
        outs.append(ask(restarted, doc + question)[0])
        cold_ttfts.append(ask(cold, doc + question)[0].timings.time_to_first_token_s)
    restarted.close()
    prompt = sum(o.usage.prompt_tokens for o in outs)
    return {"found_at_start": restarted.lower_tiers.disk.stats.found_at_start,
            "ttft_p50_s": statistics.median(o.timings.time_to_first_token_s for o in outs),
            "cold_ttft_p50_s": statistics.median(cold_ttfts),
            "cached_share": sum(o.usage.cached_tokens for o in outs) / prompt,
            "disk_share": sum(o.usage.disk_cached_tokens for o in outs) / prompt}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--documents", type=int, default=8)
    parser.add_argument("--doc-tokens", type=int, default=480)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device-chunks", type=int, default=4, help="device KV in chunks of 256 tokens")
    parser.add_argument("--dtype", default="float32", help="auto: what `k25 engine` would choose on this CPU")
    parser.add_argument("--cpu-threads", type=int, default=1,
                        help="torch's threads (1: on a shared machine a parallel region waits for a descheduled thread)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.cpu_threads)
    args.dtype = choose_dtype(args.dtype, "cpu", this_cpu_bf16_path()).name
    model = load_model(args.model)
    rng = random.Random(0)
    docs = [[rng.randrange(100, 20000) for _ in range(args.doc_tokens)] for _ in range(args.documents)]
    questions = [[rng.randrange(100, 20000) for _ in range(16)] for _ in range(4)]
    base = {"chunk_size": 256, "max_chunk_per_gpu": args.device_chunks, "max_num_batched_tokens": 512, "dtype": args.dtype}
    with tempfile.TemporaryDirectory() as disk:
        sides = {
            "tiers off": EngineConfig(**base, kv_host_tier_gib=0.0),
            "host tier": EngineConfig(**base, kv_host_tier_gib=1.0),
            "disk tier only (host = one prompt)": EngineConfig(**base, kv_host_tier_gib=1e-9, kv_disk_tier_path=disk),
        }
        results = run_sides({name: LLMEngine(model, config) for name, config in sides.items()}, docs, questions, args.rounds)
        restart = after_restart(model, docs, questions[-1][::-1], sides["disk tier only (host = one prompt)"],
                                sides["tiers off"])
    off = results["tiers off"]
    print(f"{args.documents} documents x {args.doc_tokens} tokens, device KV {args.device_chunks * 256} tokens, "
          f"{args.rounds} rounds, {args.model} {args.dtype}, {args.cpu_threads} CPU thread(s)")
    for name, r in results.items():
        print(f"{name:36s} TTFT p50 {r['ttft_p50_s'] * 1000:8.1f} ms ({r['ttft_p50_s'] / off['ttft_p50_s']:.2f}x)  "
              f"later rounds {r['later_rounds_s']:6.2f} s (throughput {off['later_rounds_s'] / r['later_rounds_s']:.3f}x; "
              f"a question's time, median against tiers off beside it {r['paired_time_p50']:.3f}x)  "
              f"cached tokens {r['cached_tokens']} (host {r['host_hit_tokens']}, disk {r['disk_hit_tokens']})")
    print(f"{'after a restart (disk tier)':36s} TTFT p50 {restart['ttft_p50_s'] * 1000:8.1f} ms "
          f"({restart['ttft_p50_s'] / restart['cold_ttft_p50_s']:.2f}x a new engine without tiers beside it, "
          f"{restart['cold_ttft_p50_s'] * 1000:.1f} ms)  "
          f"({restart['found_at_start']} blocks found on disk at start)  prompt served cached {restart['cached_share']:.1%}, "
          f"from disk {restart['disk_share']:.1%}")
    return {**results, "after restart": restart}


if __name__ == "__main__":
    main()
