"""Questions about one long document, uploaded once, against asking every passage each time.

    .venv/bin/python -m bench.document_questions --url http://127.0.0.1:8000 --model smollm2-135m \\
        --document tests/fixtures/contracts/*.txt --question "..." --question "..." [--every-passage 2 3] \\
        [--max-tokens 32 --note-max-tokens 32] [--read notes] [--warm] [--again]

The files are joined (a blank line between) into one document and stored with POST /v1/documents;
each question is then asked by id (the gateway reads the passages that bear on it, together or as
notes: --read, default the gateway's `auto`), one at a time, and timed end to end. Then the
questions numbered in --every-passage (1-based) are asked again with the document inline,
`passages` set to its passage count and `read` to notes: every passage read, as the route did
before passages were ranked. Run it on a fresh stack: the by-id questions come first, so they meet
no passage cached by the every-passage run. Each row gives the passages read (their numbers, best
first, where a few were read), the prompt tokens and those found cached, and the tokens generated
(every note's and the answer's): what a question's time went to. With --again the by-id questions
are asked once more at the end, their passages then cached: what is left is mostly decoding.
With --warm the upload prefills every passage's KV (`"warm": true`; its time is the store's line).
"""

import argparse
import time
from pathlib import Path

import httpx


def ask(client: httpx.Client, body: dict) -> tuple[float, dict]:
    started = time.perf_counter()
    response = client.post("/v1/documents/ask", json=body)
    response.raise_for_status()
    return time.perf_counter() - started, response.json()


def passages_read(answer: dict, listed_up_to: int = 8) -> str:
    read = answer["passages_read"]
    numbers = f" ({', '.join(str(p['index']) for p in read)})" if len(read) <= listed_up_to else ""
    return f"{len(read)} of {answer['chunks']}{numbers}"


def row(label: str, number: int, seconds: float, answer: dict, first_s: float | None) -> str:
    usage = answer["usage"]
    versus = f"{seconds / first_s:.2f}×" if first_s else "—"
    return (f"| {label} | {number} | {seconds:.1f} | {versus} | {passages_read(answer)} | {usage['prompt_tokens']} | "
            f"{usage['prompt_tokens_details']['cached_tokens']} | {usage['completion_tokens']} |")


def side_by_side(by_id_s: dict[int, float], every_passage_s: dict[int, float]) -> str:
    """Each question asked both ways: its time by id over its time with every passage read."""
    return "by id ÷ every passage: " + "; ".join(
        f"question {number} {by_id_s[number] / seconds:.2f}" for number, seconds in every_passage_s.items())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--document", nargs="+", required=True, help="files joined into one document")
    parser.add_argument("--question", action="append", required=True)
    parser.add_argument("--every-passage", type=int, nargs="*", default=[], metavar="N",
                        help="question numbers (1-based) also asked with every passage read, after the others")
    parser.add_argument("--max-tokens", type=int, help="tokens of each answer at most (default: the gateway's)")
    parser.add_argument("--note-max-tokens", type=int, help="tokens of each passage's note at most (default: the gateway's)")
    parser.add_argument("--read", choices=("auto", "together", "notes"),
                        help="how the questions by id read their passages (default: the gateway's, auto)")
    parser.add_argument("--warm", action="store_true", help="warm the document's KV at upload")
    parser.add_argument("--again", action="store_true",
                        help="last, ask the questions by id once more: their passages cached, what is left is decoding")
    parser.add_argument("--timeout-s", type=float, default=1800)
    args = parser.parse_args(argv)
    limits = {name: value for name, value in (("max_tokens", args.max_tokens), ("note_max_tokens", args.note_max_tokens))
              if value is not None}
    reading = {"read": args.read} if args.read else {}
    text = "\n\n".join(Path(f).read_text(encoding="utf-8") for f in args.document)
    with httpx.Client(base_url=args.url, timeout=args.timeout_s) as client:
        started = time.perf_counter()
        stored = client.post("/v1/documents", json={"text": text, "name": "joined", "warm": args.warm})
        stored.raise_for_status()
        document = stored.json()
        print(f"stored {document['id']}: {len(text.encode())} bytes, {document['tokens']} tokens, "
              f"{document['passage_count']} passages, in {time.perf_counter() - started:.1f} s\n")
        print("| route | question | seconds | × the first | passages read | prompt tokens | of them cached | generated |")
        print("|---|---|---|---|---|---|---|---|")

        def by_id(question: str) -> tuple[float, dict]:
            return ask(client, {"model": args.model, "document_id": document["id"], "question": question, **limits,
                                **reading})

        first_s, by_id_s, every_passage_s = None, {}, {}
        for number, question in enumerate(args.question, 1):
            seconds, answer = by_id(question)
            print(row(f"by id, {answer['read']}", number, seconds, answer, first_s), flush=True)
            first_s, by_id_s[number] = first_s or seconds, seconds
        for number in args.every_passage:
            seconds, answer = ask(client, {"model": args.model, "document": text, "question": args.question[number - 1],
                                           "passages": document["passage_count"], "read": "notes", **limits})
            print(row("inline, every passage as notes", number, seconds, answer, first_s), flush=True)
            every_passage_s[number] = seconds
        for number, question in enumerate(args.question if args.again else [], 1):
            seconds, answer = by_id(question)
            print(row(f"by id, {answer['read']}, again", number, seconds, answer, first_s), flush=True)
        if every_passage_s:
            print("\n" + side_by_side(by_id_s, every_passage_s))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
