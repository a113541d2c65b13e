"""Each part runs with only its own dependencies: pyproject.toml's core `dependencies` plus
that part's extra. For each part a fresh interpreter gets an import hook that refuses
every installed third-party distribution outside those (and outside what they require in
turn), then imports every module of the part, everything those modules import lazily, and
runs `k25 <command> --help` for the part's commands. The extras are read from
pyproject.toml, so the test and the packaging cannot disagree."""

import ast
import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.helpers.paths import REPO, VLLM_PYTHON

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
FIRST_PARTY = {"proto", "common", "engine", "services", "operators", "bench", "k25", "tests"}
# run by hand, not by any part: `make proto` (needs grpcio-tools, a test dependency)
DEV_TOOLS = {"proto.generate"}
# benchmarks that measure a part need that part's extra too
BENCH_OF_ENGINE = {"bench.engine_bench", "bench.lora_bench", "bench.quant_bench", "bench.quant_bytes", "bench.quant_kl",
                   "bench.profile_command", "bench.profile_run", "bench.profile_workload", "bench.kv_tiers_bench",
                   "bench.kv_tier_copy_cost", "bench.kv_tiers_routing_bench", "bench.constraint_cost",
                   "bench.gpu_check", "bench.graph_replay_check", "bench.attention_check", "bench.decode_roofline",
                   "bench.kv_tier_check"}
BENCH_OF_CHUNKER = {"bench.chunker_bench", "bench.chunker_baseline"}
BENCH_OF_GATEWAY = {"bench.passage_recall"}  # measures the gateway's passage ranker
# the vLLM backend's modules that import vLLM: they run in vLLM's own environment (`make vllm`,
# the engine-vllm image), checked below by test_the_vllm_backend_imports_in_vllms_environment
VLLM_BACKEND = {"engine.vllm_core.core", "engine.vllm_core.adapters", "engine.vllm_core.engine_plan",
                "engine.vllm_core.headless"}


def modules_under(package: str) -> list[str]:
    root = REPO.joinpath(*package.split("."))
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if "__pycache__" not in parts and name not in DEV_TOOLS:
            found.append(name)
    return found


BENCH = [m for m in modules_under("bench") if m not in BENCH_OF_ENGINE | BENCH_OF_CHUNKER | BENCH_OF_GATEWAY]
# part: (the extras it installs, the modules it runs, the CLI commands that are its own)
PARTS = {
    "core": ([], modules_under("proto") + modules_under("common") + ["k25.cli"], [[]]),
    "engine": (["engine"], [m for m in modules_under("engine") if m not in VLLM_BACKEND] + ["k25.commands.engine", "k25.commands.generate",
                                                      "k25.commands.engine_settings"],
               [["engine"], ["generate"]]),
    "gateway": (["gateway"], modules_under("services.gateway") + ["k25.commands.gateway", "k25.commands.api_key"],
                [["gateway"], ["api-key"]]),
    "chunker": (["chunker"], modules_under("services.chunker") + ["k25.commands.chunker", "k25.commands.chunk"],
                [["chunker"], ["chunk"]]),
    "operator": (["operator"], modules_under("operators") + ["k25.commands.operator", "k25.commands.rollout",
                                                             "k25.commands.secrets"],
                 [["operator"], ["rollout"], ["secrets", "ensure"]]),
    "bench": (["bench"], BENCH + ["k25.commands.simulate"], [["simulate"], ["bench", "serve"]]),
    "bench-engine": (["engine", "bench"], sorted(BENCH_OF_ENGINE), [["bench", "engine"], ["bench", "load"], ["bench", "quant"],
                                                                    ["bench", "profile"], ["bench", "gpu"]]),
    "bench-chunker": (["chunker", "bench"], sorted(BENCH_OF_CHUNKER), [["bench", "chunk"]]),
    "bench-gateway": (["gateway", "bench"], sorted(BENCH_OF_GATEWAY), [["bench", "serve"]]),
    "all": (["all"], [m for p in sorted(FIRST_PARTY - {"tests"}) for m in modules_under(p) if m not in VLLM_BACKEND],
            [["up"], ["bench"]]),
}
RUNTIME_PARTS = ["engine", "gateway", "chunker", "operator"]


# --- what a part may import -----------------------------------------------------------------

def requirements_of(extras: list[str]) -> list[Requirement]:
    """The core dependencies and these extras' requirements, an extra naming the project itself expanded."""
    found, todo, done = [Requirement(r) for r in PROJECT["dependencies"]], list(extras), set()
    while todo:
        extra = todo.pop()
        if extra not in done:
            done.add(extra)
            for requirement in map(Requirement, PROJECT["optional-dependencies"][extra]):
                if canonicalize_name(requirement.name) == canonicalize_name(PROJECT["name"]):
                    todo.extend(requirement.extras)
                else:
                    found.append(requirement)
    return found


def declared(extras: list[str]) -> set[str]:
    return {canonicalize_name(r.name) for r in requirements_of(extras)}


def installed_closure(requirements: list[Requirement]) -> set[str]:
    """The installed distributions these requirements pull in, what those require included
    (pip would install them too)."""
    closure, seen, todo = set(), set(), [(r, "") for r in requirements]
    while todo:
        requirement, extra = todo.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(requirement.name)
        try:
            distribution = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # an optional or other-platform requirement that is not here
        closure.add(name)
        for wanted in {"", *requirement.extras}:
            if (name, wanted) not in seen:
                seen.add((name, wanted))
                todo.extend((Requirement(sub), wanted) for sub in distribution.requires or [])
    return closure


def vendored_by(distribution: str) -> str | None:
    """The distribution that carries `distribution` inside its own package (setuptools ships
    jaraco.* under setuptools/_vendor, found once setuptools is imported), or None."""
    root = Path(importlib.metadata.distribution(distribution).locate_file(""))
    if "site-packages" not in root.parts:
        return None
    inside = root.parts[root.parts.index("site-packages") + 1 :]
    return canonicalize_name(inside[0]) if inside else None


def blocked_names(extras: list[str]) -> list[str]:
    """Top-level import names of installed distributions that this part must not use (what an
    allowed distribution vendors comes with it)."""
    allowed = installed_closure(requirements_of(extras))
    return sorted(name for name, dists in importlib.metadata.packages_distributions().items()
                  if name not in FIRST_PARTY and name not in sys.stdlib_module_names and name.isidentifier()
                  and not {canonicalize_name(d) for d in dists} & allowed
                  and not all(vendored_by(d) in allowed for d in dists))


# --- what a part's modules import, read from their source --------------------------------------

class Imports(ast.NodeVisitor):
    """Every module a file imports, at its top or inside functions; imports under `try:
    ... except ImportError` (optional ones) and under `if TYPE_CHECKING:` are left out."""

    def __init__(self, module: str, is_package: bool):
        self.package = module if is_package else module.rpartition(".")[0]
        self.found: list[str] = []

    def visit_Try(self, node: ast.Try) -> None:
        optional = any(h.type is None or any(n in ast.unparse(h.type) for n in ("ImportError", "ModuleNotFoundError", "Exception"))
                       for h in node.handlers)
        for child in ([] if optional else node.body) + node.orelse + node.finalbody + node.handlers:
            self.visit(child)

    def visit_If(self, node: ast.If) -> None:
        if "TYPE_CHECKING" not in ast.unparse(node.test):
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.found.extend(alias.name for alias in node.names)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".")[: len(self.package.split(".")) - node.level + 1]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module
        self.found.append(module)
        # `from package import submodule` imports the submodule
        self.found.extend(f"{module}.{a.name}" for a in node.names if module_path(f"{module}.{a.name}") is not None)


def module_path(module: str):
    if module.partition(".")[0] not in FIRST_PARTY:
        return None
    base = REPO.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def imports_of(module: str) -> list[str]:
    path = module_path(module)
    visitor = Imports(module, path.name == "__init__.py")
    visitor.visit(ast.parse(path.read_text(), str(path)))
    return visitor.found


def to_import(modules: list[str]) -> list[str]:
    """The part's modules and every module they import, lazily or not (the vLLM backend's only
    in vLLM's environment)."""
    wanted = dict.fromkeys(modules)
    for module in modules:
        wanted.update(dict.fromkeys(m for m in imports_of(module) if m not in VLLM_BACKEND))
    return list(wanted)


# --- the blocked interpreter -------------------------------------------------------------------

CHILD = r"""
import contextlib, importlib, importlib.abc, importlib.util, io, json, sys

config = json.loads(sys.argv[1])
BLOCKED = frozenset(config["blocked"])


class Blocker(importlib.abc.MetaPathFinder):
    # refuses every blocked distribution's modules, as if they were not installed
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: not a dependency of this part)", name=name)
        return None


# libraries probe for optional packages with importlib.util.find_spec (transformers does
# for accelerate): to them a blocked one is simply absent
probe = importlib.util.find_spec
importlib.util.find_spec = lambda name, package=None: (
    None if not name.startswith(".") and name.partition(".")[0] in BLOCKED else probe(name, package))
# what site's .pth files loaded before this hook: forgotten, so a later import is refused too
for loaded in [m for m in sys.modules if m.partition(".")[0] in BLOCKED]:
    del sys.modules[loaded]
sys.meta_path.insert(0, Blocker())

failures = {}
for module in config["modules"]:
    try:
        importlib.import_module(module)
    except BaseException as exc:
        failures[module] = f"{type(exc).__name__}: {exc}"
commands = {}
for argv in config["commands"]:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            import k25.cli
            k25.cli.main([*argv, "--help"])
        code = "returned"
    except SystemExit as exc:
        code = exc.code
    except BaseException as exc:
        code = f"{type(exc).__name__}: {exc}"
    commands[" ".join(argv)] = {"code": code, "output": out.getvalue()}
print(json.dumps({"failures": failures, "commands": commands}))
"""


def run_blocked(extras: list[str], modules: list[str], commands: list[list[str]]) -> dict:
    config = {"blocked": blocked_names(extras), "modules": modules, "commands": commands}
    result = subprocess.run([sys.executable, "-c", CHILD, json.dumps(config)], cwd=REPO, capture_output=True, text=True, check=False,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize("part", PARTS)
def test_each_part_imports_and_runs_its_commands_with_only_its_extra(part):
    extras, modules, commands = PARTS[part]
    result = run_blocked(extras, to_import(modules), commands)
    assert result["failures"] == {}, f"with only {['core', *extras]} installed"
    for argv, outcome in result["commands"].items():
        assert outcome["code"] == 0, (argv, outcome)
        assert outcome["output"].startswith(f"usage: k25 {argv}".rstrip()), (argv, outcome["output"][:300])


def test_the_vllm_backend_imports_in_vllms_environment():
    """vLLM's environment holds vLLM and, without K25's own pins, what the engine's server and
    the vLLM backend import; `k25 engine --help` runs there."""
    assert VLLM_PYTHON.exists(), f"{VLLM_PYTHON} is missing: `make vllm` builds it"
    modules = sorted(VLLM_BACKEND | {"engine.serve.server", "engine.serve.heartbeat", "k25.commands.engine_backend"})
    script = f"import importlib, k25.cli; [importlib.import_module(m) for m in {modules!r}]; k25.cli.main(['engine', '--help'])"
    result = subprocess.run([str(VLLM_PYTHON), "-c", script], cwd=REPO, capture_output=True, text=True, check=False,
                            timeout=300)
    assert result.returncode == 0 and "--backend {k25,vllm}" in result.stdout, result.stderr[-3000:]


def test_the_blocker_blocks():
    """With only the gateway's extra, the engine's model code is refused for want of torch
    (installed here, so it is the hook that refuses it), kopf and matplotlib are absent, and
    the gateway's own modules import. Another part's --help still works: registering a
    command imports none of its part's dependencies."""
    assert importlib.metadata.version("torch") and importlib.metadata.version("kopf")
    result = run_blocked(["gateway"], ["engine.model.llama", "services.gateway.app", "kopf", "matplotlib"], [["engine"]])
    assert result["failures"].keys() == {"engine.model.llama", "kopf", "matplotlib"}
    assert re.match(r"ModuleNotFoundError: No module named 'torch' \(blocked", result["failures"]["engine.model.llama"])
    assert "blocked" in result["failures"]["kopf"]
    assert result["commands"]["engine"]["code"] == 0


# --- the extras themselves ---------------------------------------------------------------------

def third_party_imports(modules: list[str]) -> dict[str, str]:
    """Top-level third-party name -> the first of these modules that imports it."""
    found = {}
    for module in filter(module_path, modules):
        for name in imports_of(module):
            top = name.partition(".")[0]
            if top not in FIRST_PARTY and top not in sys.stdlib_module_names:
                found.setdefault(top, module)
    return found


@pytest.mark.parametrize("part", PARTS)
def test_each_part_declares_what_its_code_imports_directly(part):
    """Not merely something its dependencies happen to bring: a name the part's own code
    imports is a distribution the part (or the core) lists."""
    extras, modules, _ = PARTS[part]
    mine = declared(extras)
    distributions = importlib.metadata.packages_distributions()
    undeclared = {name: module for name, module in third_party_imports(to_import(modules)).items()
                  if not {canonicalize_name(d) for d in distributions.get(name, [name])} & mine}
    assert undeclared == {}, f"imported but not in {['core', *extras]} of pyproject.toml"


def test_the_core_is_what_the_shared_base_imports():
    """Every core dependency is imported by proto/, common/ or the CLI: a part's dependency
    never hides in the core."""
    _, modules, _ = PARTS["core"]
    distributions = importlib.metadata.packages_distributions()
    used = {canonicalize_name(d) for name in third_party_imports(to_import(modules)) for d in distributions.get(name, [])}
    assert {canonicalize_name(Requirement(r).name) for r in PROJECT["dependencies"]} <= used


def test_all_is_every_part_and_test_stays_apart():
    parts = set(PROJECT["optional-dependencies"]) - {"all", "test"}
    assert parts == {"engine", "gateway", "chunker", "operator", "bench"}
    assert declared(["all"]) == set().union(*(declared([p]) for p in parts))
    assert "'.[all,test]'" in (REPO / "Makefile").read_text()


@pytest.mark.parametrize("part", RUNTIME_PARTS)
def test_no_runtime_part_pulls_in_plotting_progress_bars_or_another_parts_weight(part):
    pulled = installed_closure(requirements_of([part]))
    assert "matplotlib" not in pulled
    # tqdm comes with tokenizers' huggingface-hub, but no part of ours asks for it: only benchmarks use it
    assert "tqdm" not in declared([part])
    if part != "engine":
        assert "torch" not in pulled and "triton" not in pulled
    if part != "operator":
        assert "kopf" not in pulled and "kubernetes" not in pulled


def test_torchs_range_admits_the_cpu_build_the_makefile_installs_first():
    [torch] = [r for r in requirements_of(["engine"]) if r.name == "torch"]
    pinned = re.search(r"pip install --quiet torch==([\d.]+)", (REPO / "Makefile").read_text()).group(1)
    assert torch.specifier.contains(pinned) and pinned.startswith("2.13")
    assert [p for p in PROJECT["optional-dependencies"] if any(Requirement(r).name == "torch"
                                                               for r in PROJECT["optional-dependencies"][p])] == ["engine"]
