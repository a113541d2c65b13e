"""`k25 chunk FILE`: cut a document into passages at clause boundaries, offline, as JSON."""

import argparse
import json
import sys

DEFAULT_MODEL = "smollm2-135m"


def add_passage_params(p: argparse.ArgumentParser) -> None:
    """--passage-tokens (old name --chunk-size), --overlap-ratio, --semantic-threshold, with the chunker's defaults."""
    from services.chunker.boundaries import MAX_OVERLAP_RATIO, ChunkParams

    defaults = ChunkParams()
    p.add_argument(
        "--passage-tokens", "--chunk-size", dest="passage_tokens", type=int, default=defaults.passage_tokens,
        help=f"a passage's token budget: most tokens per passage (default {defaults.passage_tokens}); "
        "--chunk-size is its old name",
    )
    p.add_argument(
        "--overlap-ratio", type=float, default=defaults.overlap_ratio,
        help=f"share of --passage-tokens repeated from the previous passage, 0 to {MAX_OVERLAP_RATIO} "
        f"(default {defaults.overlap_ratio})",
    )
    p.add_argument(
        "--semantic-threshold", type=float, default=defaults.semantic_threshold,
        help="weakest anchor that may end a passage by choice, 0 (any line) to 1 (chapters only) "
        f"(default {defaults.semantic_threshold})",
    )


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "chunk",
        help="cut a document into passages at clause boundaries (offline)",
        description="Prints the document's passages as JSON, {\"chunks\": [{start_char, end_char, start_token, "
        "end_token, anchor}, ...]}: character offsets into the file's text, token offsets into its tokens under --model.",
    )
    p.add_argument("file", metavar="FILE", help="a UTF-8 text file, or - for standard input")
    add_passage_params(p)
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"whose tokenizer counts the tokens (default {DEFAULT_MODEL})")
    p.set_defaults(handler=run)


def read_text(path: str) -> str:
    """A file's (or stdin's) text; ValueError with a clear message if it cannot be read as UTF-8."""
    try:
        data = sys.stdin.buffer.read() if path == "-" else open(path, "rb").read()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None


def run(args: argparse.Namespace) -> int:
    from common.model_source import ModelLoadError
    from common.tokenizer import load_tokenizer
    from services.chunker.boundaries import ChunkParams
    from services.chunker.chunker import Chunker

    try:
        params = ChunkParams(args.passage_tokens, args.overlap_ratio, args.semantic_threshold)
        text = read_text(args.file)
        chunker = Chunker(load_tokenizer(args.model))
    except (ValueError, ModelLoadError) as exc:
        print(f"k25 chunk: {exc}", file=sys.stderr)
        return 2
    document = chunker.split(text, params)
    # the output keeps its key "chunks": the list of passages
    json.dump({"chunks": [passage.as_dict() for passage in document.passages]}, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0
