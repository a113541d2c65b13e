"""Writes the reference pages under docs/reference/ from the code, so that they cannot drift.

    .venv/bin/python docs/gen_reference.py           # write the pages (`make docs-reference`)
    .venv/bin/python docs/gen_reference.py --check   # exit 1 and name the stale pages

The sources:
- the `k25` command line: the argparse parser that `k25.cli.build_parser()` builds;
- the chart's values: `charts/k25/values.schema.json`, defaults from `charts/k25/values.yaml`;
- the custom resources: `charts/k25/crds/*.yaml`;
- the metrics: the Prometheus registry of each part (METRICS_SOURCES below);
- the error codes: the `ErrorCode` enum of `proto/k25.proto` (through `proto.k25_pb2`) and the
  gateway's mapping of each code to an HTTP answer.

The command line's page is written by gen_reference_cli.py, the chart's and the custom resources'
by gen_reference_schemas.py, both beside this script. It lives outside the runtime packages on
purpose: nothing that serves imports it.
tests/docs/test_reference_pages.py fails when the committed pages differ from what it writes.
"""

import argparse
import importlib
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "reference"
DOCS = str(REPO / "docs")
if DOCS not in sys.path:  # the page modules beside this file, also when a test loads it by its path
    sys.path.insert(0, DOCS)

from gen_reference_cli import cli_page
from gen_reference_markdown import HEADER, REGENERATE, cell
from gen_reference_schemas import chart_page, crd_page

# Where each part declares its metrics: (part, module, class whose instances own a
# `registry`). Update this list, and only this list, when a metrics module moves.
METRICS_SOURCES = [
    ("engine", "engine.serve.metrics", "EngineMetrics"),
    ("gateway", "services.gateway.metrics", "GatewayMetrics"),
    ("chunker", "services.chunker.metrics", "ChunkerMetrics"),
]

# What each engine error code means. The generator refuses to run when the enum gains a
# code that this table does not explain.
ERROR_MEANINGS = {
    "INVALID_ARGUMENT": "The request is malformed or can never be served (a prompt plus `max_tokens` beyond the "
                        "engine's capacity, a bad adapter path or checksum, a malformed frame).",
    "CHUNK_SIZE_MISMATCH": "The prompt was padded for another `chunk_size` than the engine's; the gateway tries "
                           "another engine.",
    "RESOURCE_EXHAUSTED": "KV use is above the admission limit (92%) or the waiting queue is full; the gateway "
                          "tries another engine, then answers 503 with `Retry-After`.",
    "ADAPTER_NOT_FOUND": "The engine does not hold the requested adapter version (or its files are missing).",
    "DEADLINE_EXCEEDED": "The request's deadline passed before it finished.",
    "CANCELLED": "Cancelled by the client, or refused by an engine that is draining or unhealthy (not started: the "
                 "gateway sends it elsewhere), or cut at the end of a drain.",
    "INTERNAL": "The engine failed on this request; details stay in the engine's log.",
}


# ---------------------------------------------------------------- metrics

def _metrics_page() -> str:
    lines = [HEADER.format(cmd=REGENERATE), "# Metrics\n\n",
             "Every Prometheus metric family K25 exports, read from each part's registry. Each process serves "
             "its own at `/metrics`: the gateway on its HTTP port, the engine on `--metrics-port` (9100 in the "
             "chart), the chunker on `--metrics-port` (9600). With `monitoring.serviceMonitor.enabled`, engine "
             "series also carry a `pool` label. Counters are exported with the `_total` suffix, histograms as "
             "`_bucket`, `_sum` and `_count`. The operator exports no metrics of its own: its decisions are in "
             "each EnginePool's and AdapterRollout's status and conditions (`kubectl describe`).\n"]
    for part, module, cls in METRICS_SOURCES:
        instance = getattr(importlib.import_module(module), cls)()
        collectors = list(instance.registry._collector_to_names)
        lines.append(f"\n## {part.capitalize()} (`{module}`)\n\n"
                     "| metric | type | labels | meaning |\n|---|---|---|---|\n")
        for collector in sorted(collectors, key=lambda c: c._name):
            kind = collector._type
            name = collector._name + ("_total" if kind == "counter" else "")
            labels = ", ".join(f"`{label}`" for label in collector._labelnames) or "—"
            meaning = collector._documentation
            if kind == "histogram":
                bounds = ", ".join(f"{b:g}" for b in collector._upper_bounds if b != float("inf"))
                meaning += f" (buckets: {bounds})"
            lines.append(f"| `{name}` | {kind} | {labels} | {cell(meaning)} |\n")
    return "".join(lines)


# ---------------------------------------------------------------- error codes

def _errors_page() -> str:
    from proto import k25_pb2
    from services.gateway import errors

    codes = [(v.name, v.number) for v in k25_pb2.ErrorCode.DESCRIPTOR.values if v.number != 0]
    missing = [name for name, _ in codes if name not in ERROR_MEANINGS]
    if missing:
        raise SystemExit(f"docs/gen_reference.py: explain the new error codes {missing} in ERROR_MEANINGS")
    lines = [HEADER.format(cmd=REGENERATE), "# Error codes\n\n",
             "Every engine error is one code of the `ErrorCode` enum of `proto/k25.proto` plus a message. "
             "The gateway answers clients in OpenAI's error shape (`{\"error\": {\"message\", \"type\", "
             "\"code\"}}`) with the HTTP status below; a code marked *retried* is first tried on another "
             "engine, and a 503 carries `Retry-After`. The messages of `ADAPTER_NOT_FOUND`, "
             "`CHUNK_SIZE_MISMATCH` and `INTERNAL` stay in the gateway's log; the client gets a plain message "
             "quoting the request id (`x-request-id`).\n\n",
             "| code | number | HTTP | OpenAI `type` / `code` | retried elsewhere | meaning |\n|---|---|---|---|---|---|\n"]
    for name, number in codes:
        status, type_, code = errors._ENGINE_ERRORS.get(number, (500, "server_error", "engine_error"))
        retried = "yes" if number in errors.RETRYABLE_ENGINE_ERRORS else "no"
        lines.append(f"| `{name}` | {number} | {status} | `{type_}` / `{code}` | {retried} | {cell(ERROR_MEANINGS[name])} |\n")
    reasons = [(v.name, v.number) for v in k25_pb2.FinishReason.DESCRIPTOR.values if v.number != 0]
    lines.append("\n## Finish reasons\n\nThe engine's `FinishReason` enum; the gateway reports them in OpenAI's "
                 "`finish_reason` (`stop`, `length`), and an `ABORT` or `ERROR` as an error, never as a normal finish.\n\n"
                 "| reason | number |\n|---|---|\n")
    lines += [f"| `{name}` | {number} |\n" for name, number in reasons]
    return "".join(lines)


# ---------------------------------------------------------------- driver

PAGES = {
    "cli.md": cli_page,
    "chart-values.md": chart_page,
    "crds.md": crd_page,
    "metrics.md": _metrics_page,
    "errors.md": _errors_page,
}


def generate() -> dict[str, str]:
    """File name under docs/reference/ -> its text."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return {name: page() for name, page in PAGES.items()}


def stale_pages(pages: dict[str, str]) -> list[str]:
    return [name for name, text in pages.items()
            if not (OUT / name).exists() or (OUT / name).read_text(encoding="utf-8") != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page is out of date")
    args = parser.parse_args(argv)
    pages = generate()
    stale = stale_pages(pages)
    if args.check:
        if stale:
            print(f"out of date under docs/reference/: {', '.join(stale)}; regenerate with `{REGENERATE}`")
            return 1
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    for name in stale:
        (OUT / name).write_text(pages[name], encoding="utf-8")
        print(f"wrote docs/reference/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
