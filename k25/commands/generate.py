"""`k25 generate`: run the local engine on one prompt and print only the generated text."""

import argparse
import sys

from k25.commands.engine_settings import add_engine_settings, load_for_engine

DEFAULT_MODEL = "smollm2-135m"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "generate",
        help="generate text from one prompt with the local engine",
        description="Run the engine in this process and print only the generated text on stdout.",
    )
    p.add_argument("prompt", metavar="PROMPT")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"model name or path: smollm2-135m, tiny-random, a .gguf file or a Hugging Face folder (default {DEFAULT_MODEL})")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens to generate at most (default 128)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default 0)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None, help="makes sampling reproducible")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template to PROMPT as one user message")
    p.add_argument("--chunk-size", type=int, default=256, help="pad the prompt to a multiple of this (default 256)")
    add_engine_settings(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from common.model_source import ModelLoadError
    from engine.base.errors import EngineConfigError, EngineError
    from engine.core.sampling_params import SamplingParams
    from engine.llm_engine import LLMEngine
    from engine.offline import stream

    try:
        model, config = load_for_engine(args, chunk_size=args.chunk_size)
        engine = LLMEngine(model, config)
    except (ModelLoadError, EngineConfigError) as exc:
        print(f"k25 generate: {exc}", file=sys.stderr)
        return 2
    tokenizer = model.tokenizer
    text = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}]) if args.chat else args.prompt
    sampling = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed
    )
    try:
        for out in stream(engine, tokenizer.encode(text), sampling):
            sys.stdout.write(out.text)
            sys.stdout.flush()
            if out.error is not None:
                raise out.error
    except EngineError as exc:
        print(f"\nk25 generate: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write("\n")
    return 0
