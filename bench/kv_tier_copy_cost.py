"""What bringing a prompt's KV blocks back from a tier below the device costs, against computing
them (`python -m bench.kv_tier_copy_cost`): the measurement behind routing's tier weights
(services/gateway/held_prefix.py).

A document of L tokens plus a question is asked on an engine whose device holds little more than
one such prompt, four ways: never seen (every block computed), again at once (on the device),
after two other documents pushed it off the device into host memory, and the same on an engine
whose host tier holds one prompt in front of a disk tier (so it comes back from disk). Each way's
TTFT is a median over `--repeats` fresh documents. A tier's weight is the share of the prefill it
saves: (TTFT none - TTFT tier) / (TTFT none - TTFT device)."""

import argparse
import random
import statistics
import tempfile

import torch

from engine.base.config import EngineConfig
from engine.core.sampling_params import SamplingParams
from engine.hardware.dtype_choice import choose_dtype, this_cpu_bf16_path
from engine.llm_engine import LLMEngine
from engine.model.loader import load_model
from engine.offline import generate

CHUNK = 256
BLOCK = 16
SAMPLING = SamplingParams(max_tokens=1, ignore_eos=True)


def ttft(engine: LLMEngine, prompt: list[int]) -> tuple[float, int]:
    out = generate(engine, [prompt], SAMPLING)[0].last
    return out.timings.time_to_first_token_s, out.usage.cached_tokens


def measure(engine: LLMEngine, docs, question) -> dict[str, tuple[float, int]]:
    """Ask docs[0] cold, again, then after docs[1] and docs[2] took the device: (TTFT, cached tokens) each."""
    target = docs[0] + question
    cold, again = ttft(engine, target), ttft(engine, target)
    for doc in docs[1:]:
        ttft(engine, doc + question)
    return {"none": cold, "device": again, "below": ttft(engine, target)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--doc-tokens", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="auto", help="auto: what `k25 engine` would choose on this CPU")
    parser.add_argument("--cpu-threads", type=int, default=1,
                        help="torch's threads (1: on a shared machine a parallel region waits for a descheduled thread)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.cpu_threads)
    dtype = choose_dtype(args.dtype, "cpu", this_cpu_bf16_path()).name
    model = load_model(args.model)
    rng = random.Random(0)
    device_chunks = -(-(args.doc_tokens + 2 * BLOCK) // CHUNK) + 1  # one prompt and a chunk
    base = {"chunk_size": CHUNK, "block_size": BLOCK, "max_chunk_per_gpu": device_chunks,
            "max_num_batched_tokens": 2 * CHUNK, "dtype": dtype}
    times: dict[str, list[float]] = {"none": [], "device": [], "host": [], "disk": []}
    cached: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as disk:
        engines = {"host": LLMEngine(model, EngineConfig(**base, kv_host_tier_gib=1.0)),
                   "disk": LLMEngine(model, EngineConfig(**base, kv_host_tier_gib=1e-9, kv_disk_tier_path=disk))}
        for _ in range(args.repeats):
            for tier, engine in engines.items():
                docs = [[rng.randrange(100, 20000) for _ in range(args.doc_tokens)] for _ in range(3)]
                question = [rng.randrange(100, 20000) for _ in range(BLOCK)]
                result = measure(engine, docs, question)
                for way, key in (("none", "none"), ("device", "device"), ("below", tier)):
                    times[key].append(result[way][0])
                    cached[key] = result[way][1]
        for engine in engines.values():
            engine.close()
    p50 = {way: statistics.median(t) for way, t in times.items()}
    blocks = cached["device"] // BLOCK
    prefill = p50["none"] - p50["device"]
    print(f"{args.model} {dtype}, {args.cpu_threads} CPU thread(s), a {args.doc_tokens}-token document + {BLOCK}-token question ({blocks} blocks of {BLOCK} "
          f"held), device KV {device_chunks * CHUNK} tokens, median of {args.repeats}")
    for way in ("none", "device", "host", "disk"):
        extra = p50[way] - p50["device"]
        line = f"{way:7s} TTFT p50 {p50[way] * 1000:8.1f} ms  cached {cached[way]:5d} tokens"
        if way in ("host", "disk"):
            line += (f"  {extra / blocks * 1000:6.3f} ms a block brought back (computing one: {prefill / blocks * 1000:.3f} ms)"
                     f"  weight {(p50['none'] - p50[way]) / prefill:.3f}")
        print(line)
    return {way: {"ttft_p50_s": p50[way], "cached_tokens": cached[way]} for way in p50}


if __name__ == "__main__":
    main()
