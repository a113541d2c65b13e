"""The README and the site against the code: every `k25 ...` command and flag they show exists
in the argparse parser; every relative link of the repository's markdown files resolves inside
the repository; the README's results table names a command, a date and a machine for every
figure; the README stays short, with a first request and `helm install` near its top; and no
page speaks of how the work was organised."""

import argparse
import os
import re
import shlex

import pytest

from common.engine_settings import BY_FIELD
from tests.helpers.paths import REPO

SITE_PAGES = sorted((REPO / "docs").rglob("*.md"))
TOP_PAGES = [REPO / name for name in ("README.md", "CONTRIBUTING.md", "CHANGELOG.md")] + [REPO / "charts/k25/README.md"]
ALL_PAGES = TOP_PAGES + SITE_PAGES


def rel(path) -> str:
    return str(path.relative_to(REPO))


# ---------------------------------------------------------------- commands and flags

def parser():
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("K25_")}
    try:
        from k25.cli import build_parser
        return build_parser()
    finally:
        os.environ.update(saved)


def subcommands(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def options(p: argparse.ArgumentParser) -> set[str]:
    return {s for action in p._actions for s in action.option_strings}


# `k25` at a command position: a line's or code span's start, after a shell prompt, a path such as
# .venv/bin/, or a shell separator; then the words up to the end of that command
K25_AT_COMMAND = re.compile(r"(?:^|[;&|]\s*|\$\s+|/bin/|^\s*\./)k25((?:\s+[^\s;&|#`]+)*)")


def code_snippets(text: str) -> list[str]:
    """The lines of shell code blocks (continuation lines joined) and the inline code spans; other
    blocks hold logs, output or diagrams."""
    snippets, fenced = [], re.findall(r"^```(?:sh|bash|shell|console)\n(.*?)^```", text, flags=re.M | re.S)
    for block in fenced:
        snippets += block.replace("\\\n", " ").splitlines()
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.M | re.S)
    snippets += re.findall(r"`([^`\n]+)`", prose)
    return snippets


def k25_commands(text: str) -> list[list[str]]:
    found = []
    for snippet in code_snippets(text):
        for match in K25_AT_COMMAND.finditer(snippet.strip()):
            try:
                words = shlex.split(match.group(1), comments=True)
            except ValueError:
                words = match.group(1).split()
            found.append(words)
    return found


def problems_of(words: list[str], root: argparse.ArgumentParser) -> list[str]:
    """What in `k25 WORDS` the parser does not know; placeholders (COMMAND, ...) end the check."""
    p, path, problems = root, ["k25"], []
    for i, word in enumerate(words):
        subs = subcommands(p)
        at_subcommand = subs and not any(w.startswith("-") for w in words[:i])
        if word.startswith("-"):
            flag = word.split("=", 1)[0]
            if flag.startswith("--") and flag not in options(p) and flag != "--help":
                problems.append(f"{' '.join(path)} has no flag {flag}")
        elif at_subcommand:
            if word.isupper() or word in ("...", "…"):
                break  # a placeholder such as `k25 COMMAND --help`
            if word not in subs:
                problems.append(f"{' '.join(path)} has no subcommand {word!r}")
                break
            p, path = subs[word], path + [word]
    return problems


@pytest.mark.parametrize("page", ALL_PAGES, ids=rel)
def test_every_k25_command_and_flag_shown_exists(page):
    root = parser()
    problems = [f"`k25 {' '.join(words)}`: {problem}"
                for words in k25_commands(page.read_text(encoding="utf-8")) for problem in problems_of(words, root)]
    assert problems == []


def test_the_command_check_catches_what_it_should():
    root = parser()
    text = ("```sh\n.venv/bin/k25 up --model tiny-random --no-such-flag \\\n   --engines 2\nk25 bench nothing\n```\n"
            "and `k25 engine --max-chunk-per-gpu auto`, `kubectl -n k25 get pods`, `k25 COMMAND --help`\n")
    problems = [p for words in k25_commands(text) for p in problems_of(words, root)]
    assert problems == ["k25 up has no flag --no-such-flag", "k25 bench has no subcommand 'nothing'"]


def test_engine_and_gateway_flags_passed_through_k25_up_exist():
    """`k25 up --engine-flag=--X` hands --X to every engine: --X must be an engine flag."""
    root = parser()
    engine, gateway = options(subcommands(root)["engine"]), options(subcommands(root)["gateway"])
    bad = []
    for page in ALL_PAGES:
        for kind, flag in re.findall(r"--(engine|gateway)-flag=(--[a-z0-9-]+)", page.read_text(encoding="utf-8")):
            if flag not in (engine if kind == "engine" else gateway):
                bad.append(f"{rel(page)}: --{kind}-flag={flag}")
    assert bad == []


# ---------------------------------------------------------------- links

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", TOP_PAGES + SITE_PAGES, ids=rel)
def test_every_relative_link_resolves_inside_the_repository(page):
    """mkdocs --strict checks the site's links between pages; this checks the files outside the
    site (README, CONTRIBUTING, CHANGELOG, the chart's README) and that no link leaves the repository."""
    broken = []
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans: a regex such as [a-z]([a-z]) is no link
    for groups in LINK.findall(text):
        target = next(g for g in groups if g)
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.is_relative_to(REPO):
            broken.append(f"{target} leaves the repository")
        elif not path.exists():
            broken.append(f"{target} does not exist")
    assert broken == []


@pytest.mark.parametrize("page", ALL_PAGES, ids=rel)
def test_no_page_points_outside_the_repository(page):
    assert "../shared" not in page.read_text(encoding="utf-8")


# ---------------------------------------------------------------- the README

README = (REPO / "README.md").read_text(encoding="utf-8")


def test_the_readme_is_short_and_its_top_reaches_a_request_and_helm_install():
    lines = README.splitlines()
    assert len(lines) <= 250
    top = "\n".join(lines[:120])
    assert "make run" in top and "make test" in top
    assert "curl" in top and "/v1/chat/completions" in top
    assert "helm install" in top


def results_table() -> tuple[list[str], list[list[str]]]:
    section = README.split("## Results", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    split = [[cell.strip() for cell in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows]
    return [h.lower() for h in split[0]], [r for r in split[2:]]


def test_every_figure_in_the_results_table_names_its_command_date_and_machine():
    header, rows = results_table()
    assert {"command", "date", "machine"} <= set(header)
    assert len(rows) >= 5
    for row in rows:
        cells = dict(zip(header, row))
        assert re.search(r"`(\.venv/bin/)?(k25 |python -m pytest |python -m bench\.|make )[^`]+`", cells["command"]), row
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", cells["date"]), row
        assert cells["machine"], row


# ---------------------------------------------------------------- how the work was organised

FORBIDDEN = re.compile(r"throwaway|this session|later session|next session|last session|sessions'|"
                       r"third time|fourth time|fifth time|farm-studio|farm-bench", re.I)


@pytest.mark.parametrize("page", [REPO / "README.md", REPO / "CONTRIBUTING.md", REPO / "charts/k25/README.md"] + SITE_PAGES,
                         ids=rel)
def test_no_page_speaks_of_how_the_work_was_organised(page):
    assert FORBIDDEN.findall(page.read_text(encoding="utf-8")) == []


# ---------------------------------------------------------------- the chart's README

def test_the_chart_readme_names_every_pool_key_of_the_schema():
    import json

    schema = json.loads((REPO / "charts/k25/values.schema.json").read_text())
    readme = (REPO / "charts/k25/README.md").read_text(encoding="utf-8")
    pools = readme.split("## Engine pools", 1)[1].split("\n## ", 1)[0]
    keys = schema["definitions"]["pool"]["properties"]
    # the engine settings share one row and docs/reference/crds.md lists each
    assert "the engine settings" in pools and "docs/reference/crds.md" in pools
    assert [key for key in keys if key not in BY_FIELD and f"`{key}`" not in pools] == []


def test_every_figure_in_the_results_table_is_on_the_benchmarks_pages():
    """The README shows the latest figures; the benchmarks pages hold them with their workloads.
    A figure in the README that no benchmarks page holds was not copied from a measurement."""
    pages = "".join(p.read_text(encoding="utf-8") for p in (REPO / "docs" / "benchmarks").glob("*.md"))
    header, rows = results_table()
    missing = []
    for row in rows:
        result = dict(zip(header, row))["result"]
        for number in re.findall(r"\d+(?:\.\d+)?", result.replace(",", "")):
            if number not in pages.replace(",", ""):
                missing.append(f"{number} ({result})")
    assert missing == []
