"""Document questions on an engine whose device KV holds fewer documents than are asked about:
KV tiers on against off, in one process, one after the other (`python -m bench.kv_tiers_bench`).

D documents of L tokens each are asked Q rounds of questions, round-robin, one question at a
time (each round asks every document once, so a document's KV has left the device by the time it
is asked again). Reports each side's TTFT p50 over the rounds after the first (the first computes
every document on both sides), the wall time of those rounds, and the tokens each tier served.
With a device that holds every document (`--device-chunks` large enough) the same run measures
what the tiers cost when they are not needed.

Then the disk tier side's engine is closed (its device's cached blocks are written to disk) and a
new engine starts on the same directory, as after a restart in the same pod: each document's
first question after the restart is asked once, and its TTFT and the share of its prompt served
from disk are reported."""

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


def run(model, docs, questions, rounds, config: EngineConfig) -> dict:
    engine = LLMEngine(model, config)
    sampling = SamplingParams(max_tokens=4, ignore_eos=True)
    ttfts, cached, started = [], 0, None
    for r in range(rounds):
        if r == 1:
            started = time.perf_counter()
        for d, doc in enumerate(docs):
            out = generate(engine, [doc + questions[(r + d) % len(questions)]], sampling)[0]
            if r:
                ttfts.append(out.last.timings.time_to_first_token_s)
                cached += out.last.usage.cached_tokens
    tiers = engine.lower_tiers
    later_rounds_s = time.perf_counter() - started
    engine.close()
    return {"ttft_p50_s": statistics.median(ttfts), "later_rounds_s": later_rounds_s,
            "cached_tokens": cached, "host_hit_tokens": tiers.stats.host_hit_tokens - tiers.stats.disk_hit_tokens if tiers else 0,
            "disk_hit_tokens": tiers.stats.disk_hit_tokens if tiers else 0}


def after_restart(model, docs, question, config: EngineConfig) -> dict:
    """A new engine on the disk directory an earlier one closed: each document asked once."""
    engine = LLMEngine(model, config)
    sampling = SamplingParams(max_tokens=4, ignore_eos=True)
    outs = [generate(engine, [doc + question], sampling)[0].last for doc in docs]
    engine.close()
    prompt = sum(o.usage.prompt_tokens for o in outs)
    return {"found_at_start": engine.lower_tiers.disk.stats.found_at_start,
            "ttft_p50_s": statistics.median(o.timings.time_to_first_token_s for o in outs),
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
    base = dict(chunk_size=256, max_chunk_per_gpu=args.device_chunks, max_num_batched_tokens=512, dtype=args.dtype)
    with tempfile.TemporaryDirectory() as disk:
        sides = {
            "tiers off": EngineConfig(**base, kv_host_tier_gib=0.0),
            "host tier": EngineConfig(**base, kv_host_tier_gib=1.0),
            "disk tier only (host = one prompt)": EngineConfig(**base, kv_host_tier_gib=1e-9, kv_disk_tier_path=disk),
        }
        results = {name: run(model, docs, questions, args.rounds, config) for name, config in sides.items()}
        restart = after_restart(model, docs, questions[-1][::-1], sides["disk tier only (host = one prompt)"])
    off = results["tiers off"]
    print(f"{args.documents} documents x {args.doc_tokens} tokens, device KV {args.device_chunks * 256} tokens, "
          f"{args.rounds} rounds, {args.model} {args.dtype}, {args.cpu_threads} CPU thread(s)")
    for name, r in results.items():
        print(f"{name:36s} TTFT p50 {r['ttft_p50_s'] * 1000:8.1f} ms ({r['ttft_p50_s'] / off['ttft_p50_s']:.2f}x)  "
              f"later rounds {r['later_rounds_s']:6.2f} s (throughput {off['later_rounds_s'] / r['later_rounds_s']:.3f}x)  "
              f"cached tokens {r['cached_tokens']} (host {r['host_hit_tokens']}, disk {r['disk_hit_tokens']})")
    print(f"{'after a restart (disk tier)':36s} TTFT p50 {restart['ttft_p50_s'] * 1000:8.1f} ms "
          f"({restart['ttft_p50_s'] / off['ttft_p50_s']:.2f}x)  "
          f"({restart['found_at_start']} blocks found on disk at start)  prompt served cached {restart['cached_share']:.1%}, "
          f"from disk {restart['disk_share']:.1%}")
    return {**results, "after restart": restart}


if __name__ == "__main__":
    main()
