"""The `k25` command line. Each subcommand lives in its own module with a
`register(subparsers)` function; this file only wires them together."""

import argparse
import importlib
import logging
import sys

# module path of each subcommand group, imported only when the CLI starts so that
# `k25 --help` stays fast and one part's dependencies never load for another.
COMMAND_MODULES = [
    "k25.commands.generate",
    "k25.commands.bench",
    "k25.commands.simulate",
    "k25.commands.operator",
    "k25.commands.engine",
    "k25.commands.chunk",
    "k25.commands.chunker",
    "k25.commands.gateway",
    "k25.commands.api_key",
    "k25.commands.up",
    "k25.commands.rollout",
    "k25.commands.secrets",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="k25", description="K25: long-context LLM serving on Kubernetes.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug output to stderr")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return args.handler(args) or 0


if __name__ == "__main__":
    sys.exit(main())
