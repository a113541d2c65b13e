"""Document questions on an engine whose device KV holds fewer documents than are asked about:
KV tiers on against off, in one process, one after the other (`python -m bench.kv_tiers_bench`).

D documents of L tokens each are asked Q rounds of questions, round-robin, one question at a
time (each round asks every document once, so a document's KV has left the device by the time it
is asked again). Reports each side's TTFT p50 over the rounds after the first (the first computes
every document on both sides), the wall time of those rounds, and the tokens each tier served."""

import argparse
import random
import statistics
import tempfile
import time

from engine.base.config import EngineConfig
from engine.core.sampling_params import SamplingParams
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
    return {"ttft_p50_s": statistics.median(ttfts), "later_rounds_s": time.perf_counter() - started,
            "cached_tokens": cached, "host_hit_tokens": tiers.stats.host_hit_tokens - tiers.stats.disk_hit_tokens if tiers else 0,
            "disk_hit_tokens": tiers.stats.disk_hit_tokens if tiers else 0}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--documents", type=int, default=8)
    parser.add_argument("--doc-tokens", type=int, default=480)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device-chunks", type=int, default=4, help="device KV in chunks of 256 tokens")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args(argv)
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
    off = results["tiers off"]
    print(f"{args.documents} documents x {args.doc_tokens} tokens, device KV {args.device_chunks * 256} tokens, "
          f"{args.rounds} rounds, {args.model} {args.dtype}")
    for name, r in results.items():
        print(f"{name:36s} TTFT p50 {r['ttft_p50_s'] * 1000:8.1f} ms ({r['ttft_p50_s'] / off['ttft_p50_s']:.2f}x)  "
              f"later rounds {r['later_rounds_s']:6.2f} s (throughput {off['later_rounds_s'] / r['later_rounds_s']:.2f}x)  "
              f"cached tokens {r['cached_tokens']} (host {r['host_hit_tokens']}, disk {r['disk_hit_tokens']})")


if __name__ == "__main__":
    main()
