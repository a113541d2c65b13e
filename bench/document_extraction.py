"""A contract review's fields extracted from one stored document, twice.

    .venv/bin/python -m bench.document_extraction --url http://127.0.0.1:8000 --model smollm2-135m \\
        --document tests/fixtures/contracts/en_master_services_agreement.txt [--passages 3] [--runs 2]

The document is stored with POST /v1/documents, then POST /v1/documents/extract fills REVIEW_SCHEMA
(parties, amounts, effective date, notice period and governing law) from it `--runs` times; each run
is timed end to end and printed as a table row: its tokens, those found cached, and the fields found.
Run it on a fresh stack: the first run then meets no passage cached before it.
"""

import argparse
import time
from pathlib import Path

import httpx

# what a contract review asks of a services agreement; tests/gateway/test_gateway_extraction.py uses it too
REVIEW_SCHEMA = {"type": "object", "properties": {
    "parties": {"type": "array", "items": {"type": "string", "maxLength": 80}, "maxItems": 4,
                "description": "the companies that enter into the agreement"},
    "amounts": {"type": "array", "items": {"type": "string", "pattern": "[0-9]+%"}, "maxItems": 4,
                "description": "the percentages of interest, price increases or ownership"},
    "effective_date": {"type": "string", "pattern": "^[A-Z][a-z]+ [0-9]{1,2}, [0-9]{4}$",
                       "description": "the date the agreement is entered into"},
    "notice_period": {"type": "string", "maxLength": 60,
                      "description": "how much notice the provider must give before raising prices"},
    "governing_law": {"type": "string", "maxLength": 80, "description": "the state whose laws govern the agreement"},
}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--document", required=True)
    parser.add_argument("--passages", type=int, default=3, help="passages read per field (default 3)")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=1800)
    args = parser.parse_args(argv)
    with httpx.Client(base_url=args.url, timeout=args.timeout_s) as client:
        stored = client.post("/v1/documents", json={"text": Path(args.document).read_text(encoding="utf-8")})
        stored.raise_for_status()
        document_id = stored.json()["id"]
        print("| run | seconds | reads | prompt tokens | of them cached | completion tokens | fields found |")
        print("|---|---|---|---|---|---|---|")
        for run in range(1, args.runs + 1):
            started = time.perf_counter()
            answer = client.post("/v1/documents/extract", json={"model": args.model, "document_id": document_id,
                                                                "schema": REVIEW_SCHEMA, "passages": args.passages})
            answer.raise_for_status()
            result, seconds = answer.json(), time.perf_counter() - started
            usage = result["usage"]
            reads = sum(len(field["passages_read"]) for field in result["fields"].values())
            found = {name: value for name, value in result["data"].items() if value is not None}
            print(f"| {run} | {seconds:.1f} | {reads} | {usage['prompt_tokens']} | "
                  f"{usage['prompt_tokens_details']['cached_tokens']} | {usage['completion_tokens']} | {found} |", flush=True)
        client.delete(f"/v1/documents/{document_id}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
