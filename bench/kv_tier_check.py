"""`k25 bench gpu`, section kv_tiers: documents asked round-robin on an engine whose device KV holds
fewer of them than are asked about, with a host tier (on CUDA: pinned memory, copies down on a
copy stream) against tiers off, greedy: every answer token for token, the blocks copied each way,
and the TTFT p50 of the questions after the first round (the first computes every document on
both sides). Off CUDA the same code runs on the CPU tier path and the section says so."""

import random
import statistics

import torch

from engine.base.config import EngineConfig
from engine.core.sampling_params import SamplingParams
from engine.llm_engine import LLMEngine
from engine.model.loader import load_model
from engine.offline import generate


def kv_tier_check(model: str, device: str, dtype: str, documents: int, doc_tokens: int, rounds: int,
                  device_chunks: int, chunk_size: int, max_tokens: int = 4) -> dict:
    loaded = load_model(model, getattr(torch, dtype))
    rng = random.Random(0)
    docs = [[rng.randrange(100, loaded.config.vocab_size) for _ in range(doc_tokens)] for _ in range(documents)]
    question = [rng.randrange(100, loaded.config.vocab_size) for _ in range(16)]
    base = dict(device=device, dtype=dtype, chunk_size=chunk_size, max_chunk_per_gpu=device_chunks,
                max_num_batched_tokens=2 * chunk_size)
    engines = {"off": LLMEngine(loaded, EngineConfig(**base, kv_host_tier_gib=0.0)),
               "host": LLMEngine(loaded, EngineConfig(**base, kv_host_tier_gib=1.0))}
    sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=True)  # temperature 0: greedy
    answers = {name: [] for name in engines}
    ttfts = {name: [] for name in engines}
    for r in range(rounds):
        for doc in docs:
            for name, engine in engines.items():
                done = generate(engine, [doc + question], sampling)[0]
                answers[name].append(done.token_ids)
                if r:
                    ttfts[name].append(done.last.timings.time_to_first_token_s)
    tiers = engines["host"].lower_tiers
    pinned = tiers.pool.is_pinned()
    for engine in engines.values():
        engine.close()
    stats = tiers.stats
    differing = sum(a != b for a, b in zip(answers["off"], answers["host"]))
    p50 = {name: statistics.median(values) for name, values in ttfts.items()}
    figures = {"device": device, "dtype": dtype, "questions": len(answers["off"]), "answers_differing": differing,
               "all_tokens_match": differing == 0, "host_pool_pinned": pinned,
               "ttft_p50_s": p50, "ttft_p50_host_over_off": p50["host"] / p50["off"],
               "host_hit_tokens": stats.host_hit_tokens, "offloaded_blocks": stats.offloaded_blocks,
               "restored_blocks": stats.restored_blocks, "bytes_to_host": stats.bytes_to_host,
               "bytes_to_device": stats.bytes_to_device, "copy_seconds": stats.copy_seconds}
    if device != "cuda":
        figures["note"] = "no CUDA device: the CPU tier path (plain memory, copies on the engine thread) ran"
    return figures
