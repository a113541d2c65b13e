"""What constrained decoding costs the engine: the same streams decoded free and constrained,
in turn, in one process, so that both see the same machine.

`python -m bench.constraint_cost [--model smollm2-135m] [--streams 64] [--max-tokens 96] [--rounds 3] [--dtype auto]`

Every stream asks for one of `k25 bench serve --structured json`'s schemas (bench/serve_structured.py),
chat-templated as the gateway would. Constrained, its answer must be a list of at least
`max_tokens` such objects, so that no stream can end before `max_tokens` tokens; free, the same
prompt runs to `max_tokens` with its end-of-sequence ignored. Both sides then decode exactly the
same number of tokens in the same batches, and the figures differ only by the constraint: the
grammar's masks, computed each step, and their application to the logits. Reported per round:
generated tokens per second of wall time and per second of this process's CPU time."""

import argparse
import json
import statistics
import sys
import time

from bench.serve_structured import SCHEMA_MIX, structured_body
from engine.base.config import EngineConfig
from engine.core.sampling_params import Constraint, SamplingParams
from engine.hardware.dtype_choice import choose_dtype, this_cpu_bf16_path
from engine.llm_engine import LLMEngine
from engine.model.loader import load_model
from engine.offline import generate


def endless_schema(schema: dict, items: int) -> str:
    """A JSON Schema of a list of at least `items` objects of `schema`: no answer of fewer tokens holds."""
    return json.dumps({"type": "array", "items": schema, "minItems": items})


def workload(tokenizer, streams: int, max_tokens: int) -> tuple[list[list[int]], list[SamplingParams], list[SamplingParams]]:
    """The prompts, and each one's free and constrained sampling."""
    prompts, free, constrained = [], [], []
    for index in range(streams):
        messages = structured_body("json", index)["messages"]
        prompts.append(tokenizer.encode(tokenizer.apply_chat_template(messages), add_special_tokens=False))
        schema = SCHEMA_MIX[index % len(SCHEMA_MIX)][1]
        free.append(SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        constrained.append(SamplingParams(max_tokens=max_tokens, ignore_eos=True,
                                          constraint=Constraint("json_schema", endless_schema(schema, max_tokens))))
    return prompts, free, constrained


def run(engine: LLMEngine, prompts: list[list[int]], sampling: list[SamplingParams]) -> tuple[float, float]:
    """Generated tokens per wall second and per CPU second of this process."""
    wall, cpu = time.perf_counter(), time.process_time()
    completions = generate(engine, prompts, sampling)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    produced = sum(len(c.token_ids) for c in completions)
    expected = sum(s.max_tokens for s in sampling)
    errors = [c.last.error for c in completions if c.last is not None and c.last.error is not None]
    if produced != expected or errors:
        raise RuntimeError(f"produced {produced} of {expected} tokens; errors: {errors[:3]}")
    unconstrained = [c.text for c, s in zip(completions, sampling) if s.constraint and not c.text.lstrip().startswith("[")]
    if unconstrained:
        raise RuntimeError(f"a constrained answer is not the list its schema asks for: {unconstrained[0][:80]!r}")
    return produced / wall, produced / cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.constraint_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", default="auto", help="as k25 engine's (auto: bfloat16 where this CPU runs it)")
    args = parser.parse_args(argv)
    dtype = choose_dtype(args.dtype, "cpu", this_cpu_bf16_path() if args.dtype == "auto" else None)
    model = load_model(args.model, dtype.dtype)
    config = EngineConfig(dtype=dtype.name)
    prompts, free, constrained = workload(model.tokenizer, args.streams, args.max_tokens)
    engine = LLMEngine(model, config)
    run(engine, prompts, constrained[:2])  # warm-up: the grammars compile once, and are cached
    rounds = []
    for number in range(args.rounds):
        free_rate, free_cpu_rate = run(engine, prompts, free)
        constrained_rate, constrained_cpu_rate = run(engine, prompts, constrained)
        rounds.append({"free_tok_s": free_rate, "constrained_tok_s": constrained_rate,
                       "free_tok_per_cpu_s": free_cpu_rate, "constrained_tok_per_cpu_s": constrained_cpu_rate,
                       "wall_ratio": constrained_rate / free_rate, "cpu_ratio": constrained_cpu_rate / free_cpu_rate})
        print(f"round {number + 1}: free {free_rate:.1f} tok/s, constrained {constrained_rate:.1f} tok/s "
              f"({constrained_rate / free_rate:.3f}x); per CPU second {free_cpu_rate:.1f} and {constrained_cpu_rate:.1f} "
              f"({constrained_cpu_rate / free_cpu_rate:.3f}x)", file=sys.stderr)
    print(json.dumps({"model": args.model, "dtype": config.dtype, "streams": args.streams, "max_tokens": args.max_tokens,
                      "rounds": rounds, "median_wall_ratio": statistics.median(r["wall_ratio"] for r in rounds),
                      "median_cpu_ratio": statistics.median(r["cpu_ratio"] for r in rounds)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
