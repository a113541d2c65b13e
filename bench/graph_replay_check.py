"""`k25 bench gpu`, section graph_replay: the engine's decode steps replayed from CUDA graphs
(engine/runner/decode_graphs.py) against the same engine run eagerly, greedy, token for token.
Off CUDA no graph is captured, so both runs are eager and the section says so."""

import math

import torch

from bench.engine_bench import make_workload
from engine.base.config import EngineConfig
from engine.core.sampling_params import SamplingParams
from engine.llm_engine import LLMEngine
from engine.model.loader import load_model
from engine.offline import generate


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (a shorter one differs where it ends); None if equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _count_replays(engine: LLMEngine) -> list[int]:
    """A counter of the steps that replayed a graph (the runner falls back to eager steps
    without saying so): [0], incremented as the engine runs."""
    replays = [0]
    graphs = engine.runner.decode_graphs
    if graphs is not None:
        replay = graphs.run

        def counted(host):
            logits = replay(host)
            replays[0] += logits is not None
            return logits

        graphs.run = counted
    return replays


def _greedy_tokens(loaded, config: EngineConfig, prompts: list[list[int]], params: list[SamplingParams]):
    """Each prompt's tokens from a fresh engine, whether it captured decode graphs, and how many
    of its steps replayed one."""
    engine = LLMEngine(loaded, config)
    replays = _count_replays(engine)
    tokens = [c.token_ids for c in generate(engine, prompts, params)]
    return tokens, engine.runner.decode_graphs is not None, replays[0]


def graph_replay_check(model: str, device: str, dtype: str, prompts: int, prompt_tokens: list[int],
                       max_tokens: list[int], chunk_size: int, seed: int = 0) -> dict:
    """Greedy completions of `prompts` random prompts (lengths and max_tokens drawn from their
    ranges, so the decode batch shrinks as requests finish and several graph sizes replay),
    with cuda_graphs on and then off."""
    loaded = load_model(model, getattr(torch, dtype))
    workload = make_workload(loaded.config.vocab_size, prompts, tuple(prompt_tokens), tuple(max_tokens), seed)
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in workload.max_tokens]  # temperature 0: greedy
    # each request's padded prompt and its answer, in KV chunks, with one chunk to spare (and no
    # host tier: nothing is evicted here)
    chunks = prompts * (math.ceil(prompt_tokens[1] / chunk_size) + math.ceil(max_tokens[1] / chunk_size) + 1)
    settings = dict(device=device, dtype=dtype, chunk_size=chunk_size, max_num_seqs=prompts, max_chunk_per_gpu=chunks,
                    kv_host_tier_gib=0)
    replayed, captured, replays = _greedy_tokens(loaded, EngineConfig(**settings, cuda_graphs=True), workload.prompts, params)
    eager, _, _ = _greedy_tokens(loaded, EngineConfig(**settings, cuda_graphs=False), workload.prompts, params)
    differences = [first_difference(g, e) for g, e in zip(replayed, eager)]
    figures = {
        "model": model, "dtype": dtype, "prompts": prompts, "prompt_tokens": [len(p) for p in workload.prompts],
        "max_tokens": workload.max_tokens, "graphs_captured": captured, "steps_replayed": replays,
        "tokens_compared": sum(map(len, eager)), "all_tokens_match": all(d is None for d in differences),
        "first_difference_by_prompt": differences,
    }
    if not captured:
        figures["note"] = f"no decode graph was captured on {device} (CUDA only): both runs were eager"
    return figures
