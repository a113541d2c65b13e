"""Questions about one long document, uploaded once, against asking every passage each time.

    .venv/bin/python -m bench.document_questions --url http://127.0.0.1:8000 --model smollm2-135m \\
        --document tests/fixtures/contracts/*.txt --question "..." --question "..." [--every-passage 2 3]

The files are joined (a blank line between) into one document and stored with POST /v1/documents;
each question is then asked by id (the gateway reads the passages that bear on it), one at a time,
and timed end to end. Then the questions numbered in --every-passage (1-based) are asked again with
the document inline and `passages` set to its passage count: every passage read, as the route did
before passages were ranked. Run it on a fresh stack: the by-id questions come first, so they meet
no passage cached by the every-passage run.
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


def row(label: str, number: int, seconds: float, answer: dict, first_s: float | None) -> str:
    cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
    versus = f"{seconds / first_s:.2f}×" if first_s else "—"
    return (f"| {label} | {number} | {seconds:.1f} | {versus} | {len(answer['passages_read'])} of {answer['chunks']} | "
            f"{answer['usage']['prompt_tokens']} | {cached} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--document", nargs="+", required=True, help="files joined into one document")
    parser.add_argument("--question", action="append", required=True)
    parser.add_argument("--every-passage", type=int, nargs="*", default=[], metavar="N",
                        help="question numbers (1-based) also asked with every passage read, after the others")
    parser.add_argument("--timeout-s", type=float, default=1800)
    args = parser.parse_args(argv)
    text = "\n\n".join(Path(f).read_text(encoding="utf-8") for f in args.document)
    with httpx.Client(base_url=args.url, timeout=args.timeout_s) as client:
        started = time.perf_counter()
        stored = client.post("/v1/documents", json={"text": text, "name": "joined"})
        stored.raise_for_status()
        document = stored.json()
        print(f"stored {document['id']}: {len(text.encode())} bytes, {document['tokens']} tokens, "
              f"{document['passage_count']} passages, in {time.perf_counter() - started:.1f} s\n")
        print("| route | question | seconds | × the first | passages read | prompt tokens | of them cached |")
        print("|---|---|---|---|---|---|---|")
        first_s = None
        for number, question in enumerate(args.question, 1):
            seconds, answer = ask(client, {"model": args.model, "document_id": document["id"], "question": question})
            print(row("by id, ranked", number, seconds, answer, first_s), flush=True)
            first_s = first_s or seconds
        for number in args.every_passage:
            seconds, answer = ask(client, {"model": args.model, "document": text, "question": args.question[number - 1],
                                           "passages": document["passage_count"]})
            print(row("inline, every passage", number, seconds, answer, first_s), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
