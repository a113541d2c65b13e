"""The reference page of the `k25` command line, walked from the argparse parser that
`k25.cli.build_parser()` builds (docs/gen_reference.py writes the pages)."""

import argparse
import os

from gen_reference_markdown import HEADER, REGENERATE, cell, code


def cli_page() -> str:
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("K25_")}  # defaults read from the env
    try:
        from k25.cli import build_parser
        parser = build_parser()
    finally:
        os.environ.update(saved)
    lines = [HEADER.format(cmd=REGENERATE), "# Command line (`k25`)\n\n",
             "Every `k25` command and flag, walked from the argparse parser of `k25/cli.py`. "
             "`k25 COMMAND --help` prints the same. Flags whose default comes from the environment "
             "(`K25_REDIS_URL`, `K25_RELEASE`, ...) show the default without it.\n\n"]
    commands = list(_walk_commands(parser, ["k25"]))
    lines.append("| command | what it does |\n|---|---|\n")
    for path, sub, summary in commands:
        if path[1:]:
            lines.append(f"| [`{' '.join(path)}`](#{'-'.join(path)}) | {cell(summary)} |\n")
    for path, sub, summary in commands:
        lines.append(_command_section(path, sub, summary))
    return "".join(lines)


def _walk_commands(parser, path, summary=None):
    """(path, parser, one-line summary) for the parser and every subcommand, depth first."""
    yield path, parser, summary or parser.description or ""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield from _walk_commands(sub, path + [name], helps.get(name))


def _command_section(path, parser, summary) -> str:
    title = " ".join(path)
    out = [f"\n## {title} {{#{'-'.join(path)}}}\n\n"]
    if parser.description and parser.description != summary:
        out.append(cell(parser.description) + "\n\n")
    elif summary:
        out.append(cell(summary) + "\n\n")
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for action in subcommands:
        names = ", ".join(f"[`{title} {n}`](#{'-'.join(path + [n])})" for n in action.choices)
        out.append(f"Subcommands: {names}.\n\n")
    rows = [a for a in parser._actions if not isinstance(a, (argparse._SubParsersAction, argparse._HelpAction))
            and a.help != argparse.SUPPRESS]
    if not rows:
        return "".join(out)
    formatter = parser._get_formatter()
    out.append("| argument | value | default | meaning |\n|---|---|---|---|\n")
    for action in rows:
        name = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.metavar or action.dest}`"
        out.append(f"| {name} | {cell(_value_of(action))} | {cell(_default_of(action))} | "
                   f"{cell(formatter._expand_help(action) if action.help else '')} |\n")
    return "".join(out)


def _value_of(action) -> str:
    if action.nargs == 0:
        return "(switch)"
    if action.choices:
        return " | ".join(f"`{c}`" for c in action.choices)
    metavar = action.metavar or (action.dest.upper() if action.option_strings else action.dest)
    if isinstance(metavar, tuple):
        metavar = " ".join(metavar)
    nargs = {"*": " ...", "+": " ...", "?": " (optional)"}.get(action.nargs, "")
    if isinstance(action.nargs, int) and action.nargs > 1:
        nargs = f" ×{action.nargs}"
    repeat = " (repeatable)" if isinstance(action, argparse._AppendAction) else ""
    return f"`{metavar}`{nargs}{repeat}"


def _default_of(action) -> str:
    if not action.option_strings and action.required:
        return "required"
    if action.required:
        return "required"
    default = action.default
    if default is None or default == argparse.SUPPRESS or (action.nargs == 0 and default is False):
        return ""
    if isinstance(default, (list, tuple)):
        return code(" ".join(map(str, default))) if default else ""
    return code(str(default))
