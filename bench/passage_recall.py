"""Retrieval recall of the gateway's passage ranker on the contract fixtures: for each labelled
question (tests/fixtures/contracts/questions.json), whether the passage holding the clause it is
about is among the `k` passages the ranker puts first, per language, at several passage sizes.

    .venv/bin/python -m bench.passage_recall [--passage-tokens 512 256 128] [--k 1 2 3 4 6 8]

The passages are the chunker's (services/chunker, SmolLM2's tokenizer), as the gateway gets them."""

import argparse
import json
from pathlib import Path

from common.tokenizer import load_tokenizer
from services.chunker.boundaries import ChunkParams
from services.chunker.chunker import Chunker
from services.gateway.passage_ranker import rank

CONTRACTS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "contracts"


def labelled_questions() -> dict[str, list[dict]]:
    """Contract file name -> its questions, each with the opening of its clause's line."""
    found = json.loads((CONTRACTS / "questions.json").read_text(encoding="utf-8"))
    return {name: items for name, items in found.items() if not name.startswith("_")}


def clause_start(text: str, opening: str) -> int:
    """Where the one line that opens with `opening` starts."""
    at = [i for i in range(len(text)) if text.startswith(opening, i) and (i == 0 or text[i - 1] == "\n")]
    if len(at) != 1:
        raise ValueError(f"the label {opening!r} opens {len(at)} lines, not one")
    return at[0]


def ranks(tokenizer, passage_tokens: int) -> dict[str, list[tuple[int, int]]]:
    """Language ("en", "zh", the file's prefix) -> per question, (the best rank of a passage
    holding its clause, 0-based; the document's passage count)."""
    found: dict[str, list[tuple[int, int]]] = {}
    for name, items in labelled_questions().items():
        text = (CONTRACTS / name).read_text(encoding="utf-8")
        passages = Chunker(tokenizer).split(text, ChunkParams(passage_tokens)).passages
        texts = [text[p.start_char : p.end_char] for p in passages]
        for item in items:
            start = clause_start(text, item["clause"])
            holding = {j for j, p in enumerate(passages) if p.start_char <= start < p.end_char}
            order = rank(item["question"], texts)
            found.setdefault(name[:2], []).append((min(order.index(j) for j in holding), len(passages)))
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passage-tokens", type=int, nargs="+", default=[512, 256, 128])
    parser.add_argument("--k", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8])
    args = parser.parse_args(argv)
    tokenizer = load_tokenizer("smollm2-135m")
    print("| passage_tokens | language | questions | passages per document | " + " | ".join(f"k={k}" for k in args.k) + " |")
    print("|---|---|---|---|" + "---|" * len(args.k))
    for passage_tokens in args.passage_tokens:
        for language, found in sorted(ranks(tokenizer, passage_tokens).items()):
            counts = sorted({n for _, n in found})
            recall = [sum(r < k for r, _ in found) / len(found) for k in args.k]
            print(f"| {passage_tokens} | {language} | {len(found)} | {', '.join(map(str, counts))} | "
                  + " | ".join(f"{r:.0%}" for r in recall) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
