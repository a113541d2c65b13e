"""Two engines, more documents than both devices hold: routing that knows which engine holds a
document in host memory, against routing that does not (`python -m bench.kv_tiers_routing_bench`).

Each engine's device holds two documents and its host tier `--host-documents` (by default half
the library and one: the two hosts hold it once, not twice; a document takes the blocks of its
padded prompt, its question's and padding's blocks included). D documents of L tokens are asked
Q rounds of questions, one at a time, each round in a new random order, and each question is
asked of every side in turn (so that a machine whose speed drifts weighs on each side alike).
Every side has two engines of its own in this process, and routes with the gateway's own parts:
plan_route over the engines' load and free KV, and, where it knows them, the prefix index fed
with the engines' KV events as the wire carries them (engine/serve/kv_events.py), weighed by
held_prefix.saved_share.

- load only: no prefix index (free KV, load, then a turn that rotates);
- device only: the index as a gateway that knows no tiers reads the events (a block that left the
  device is gone);
- tier-aware: the index with the tiers.

Reports TTFT p50 and mean over the rounds after the first (the first computes every document),
the time those questions took, and the cached tokens by tier."""

import argparse
import random
import statistics
import time

import torch

from common.prefix_hash import cache_seed, chain_block_hashes
from engine.base.config import EngineConfig
from engine.core.sampling_params import SamplingParams
from engine.hardware.dtype_choice import DTYPES, choose_dtype, this_cpu_bf16_path
from engine.llm_engine import LLMEngine
from engine.model.loader import load_model
from engine.offline import Completion, collect, make_request
from engine.serve.kv_events import kv_events_message
from services.gateway.held_prefix import saved_share
from services.gateway.prefix_index import PrefixIndex
from services.gateway.routing import EngineView, plan_route

CHUNK = 256
BLOCK = 16
SAMPLING = SamplingParams(max_tokens=4, ignore_eos=True)
SIDES = ("load only", "device only", "tier-aware")


def view(engine_id: str, engine: LLMEngine) -> EngineView:
    return EngineView(engine_id, engine_id, "p", "m", CHUNK, engine.max_model_len, 1.0 - engine.kv_usage,
                      engine.num_running, engine.num_waiting, engine.config.kv_admission_limit, engine.config.max_waiting,
                      heartbeat_ttl_s=5.0, block_size=BLOCK, capacity_tokens=engine.capacity_tokens)


class Side:
    def __init__(self, name: str, model, config: EngineConfig):
        self.name = name
        self.engines = {f"e{i}": LLMEngine(model, config) for i in range(2)}
        self.index = None if name == "load only" else PrefixIndex(1 << 20)
        for engine in self.engines.values():
            engine.set_kv_events(self.index is not None)

    def route(self, prompt: list[int], turn: int) -> str:
        hashes = chain_block_hashes(prompt, BLOCK, cache_seed())
        shares = {}
        if self.index is not None:
            shares = {e: saved_share(run, BLOCK, len(prompt)) for e, run in self.index.matched_blocks(hashes).items()}
        plan = plan_route([view(e, engine) for e, engine in self.engines.items()], len(prompt), SAMPLING.max_tokens,
                          turn=turn, cached_share=shares)
        chosen = plan.routes[0].engines[0].engine_id
        if self.index is not None:
            self.index.record(chosen, "i1", hashes)
        return chosen

    def ask(self, prompt: list[int], turn: int):
        engine_id = self.route(prompt, turn)
        engine = self.engines[engine_id]
        request = make_request(engine, prompt, SAMPLING)
        completions = {request.request_id: Completion(request.request_id)}
        engine.add_request(request)
        while engine.has_unfinished():
            result = engine.step()
            collect(completions, result.outputs)
            self.hear(engine_id, result.kv_events)
        return completions[request.request_id].last

    def hear(self, engine_id: str, changes) -> None:
        if self.index is None or not changes:
            return
        message = kv_events_message(engine_id, "i1", False, changes)
        if self.name == "device only":  # a reader that knows no tiers
            message.ClearField("host")
            message.ClearField("disk")
        self.index.apply(message)


def run_sides(sides: list[Side], docs, questions, orders) -> dict:
    """Every question asked of every side in turn (the first side rotating), so that a machine
    whose speed drifts weighs on each side alike; a side's time is the sum of its questions'."""
    results = {side.name: {"ttfts": [], "later_rounds_s": 0.0, "tokens": dict.fromkeys(TOKEN_KINDS, 0)} for side in sides}
    for r, order in enumerate(orders):
        for i, d in enumerate(order):
            turn = r * len(order) + i
            for side in sides[turn % len(sides):] + sides[: turn % len(sides)]:
                started = time.perf_counter()
                out = side.ask(docs[d] + questions[(r + d) % len(questions)], turn)
                if r:
                    result = results[side.name]
                    result["later_rounds_s"] += time.perf_counter() - started
                    result["ttfts"].append(out.timings.time_to_first_token_s)
                    count_tokens(result["tokens"], out.usage)
    for side in sides:
        for engine in side.engines.values():
            engine.close()
    for result in results.values():
        ttfts = result.pop("ttfts")
        result.update(ttft_p50_s=statistics.median(ttfts), ttft_mean_s=statistics.mean(ttfts))
    return results


TOKEN_KINDS = ("prompt", "device", "host", "disk")


def count_tokens(tokens: dict, usage) -> None:
    tokens["prompt"] += usage.prompt_tokens
    tokens["host"] += usage.host_cached_tokens
    tokens["disk"] += usage.disk_cached_tokens
    tokens["device"] += usage.cached_tokens - usage.host_cached_tokens - usage.disk_cached_tokens


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--documents", type=int, default=8)
    parser.add_argument("--doc-tokens", type=int, default=480)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device-chunks", type=int, default=4, help="each engine's device KV in chunks of 256 tokens")
    parser.add_argument("--host-documents", type=int, default=None, help="each engine's host tier, in documents "
                        "(default: half of them and one)")
    parser.add_argument("--dtype", default="auto", help="auto: what `k25 engine` would choose on this CPU")
    parser.add_argument("--cpu-threads", type=int, default=1,
                        help="torch's threads (1: on a shared machine a parallel region waits for a descheduled thread)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.cpu_threads)
    dtype = choose_dtype(args.dtype, "cpu", this_cpu_bf16_path()).name
    model = load_model(args.model)
    rng = random.Random(0)
    docs = [[rng.randrange(100, 20000) for _ in range(args.doc_tokens)] for _ in range(args.documents)]
    questions = [[rng.randrange(100, 20000) for _ in range(16)] for _ in range(4)]
    orders = [rng.sample(range(args.documents), args.documents) for _ in range(args.rounds)]
    host_documents = args.host_documents if args.host_documents is not None else args.documents // 2 + 1
    shape = model.config
    block_bytes = shape.num_layers * 2 * shape.num_kv_heads * BLOCK * shape.head_dim * DTYPES[dtype].itemsize
    prompt_blocks = -(-(args.doc_tokens + BLOCK) // CHUNK) * CHUNK // BLOCK  # padded to the chunk
    host_gib = host_documents * prompt_blocks * block_bytes / (1 << 30)
    config = EngineConfig(chunk_size=CHUNK, block_size=BLOCK, max_chunk_per_gpu=args.device_chunks,
                          max_num_batched_tokens=2 * CHUNK, dtype=dtype, kv_host_tier_gib=host_gib)
    results = run_sides([Side(name, model, config) for name in SIDES], docs, questions, orders)
    base = results["load only"]
    print(f"2 engines, {args.documents} documents x {args.doc_tokens} tokens, device KV {args.device_chunks * CHUNK} tokens "
          f"each, host tier {host_documents} documents each, {args.rounds} rounds, {args.model} {dtype}, "
          f"{args.cpu_threads} CPU thread(s)")
    for name, r in results.items():
        t = r["tokens"]
        print(f"{name:12s} TTFT p50 {r['ttft_p50_s'] * 1000:8.1f} ms ({r['ttft_p50_s'] / base['ttft_p50_s']:.2f}x)  "
              f"mean {r['ttft_mean_s'] * 1000:8.1f} ms ({r['ttft_mean_s'] / base['ttft_mean_s']:.2f}x)  "
              f"later rounds {r['later_rounds_s']:6.1f} s ({base['later_rounds_s'] / r['later_rounds_s']:.2f}x throughput)  "
              f"prompt tokens cached: device {t['device'] / t['prompt']:.0%}, host {t['host'] / t['prompt']:.0%}, "
              f"disk {t['disk'] / t['prompt']:.0%}")
    return results


if __name__ == "__main__":
    main()
