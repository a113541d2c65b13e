"""The package map is the architecture: every import between runtime packages points down.

    k25 (the command line, `k25 up`)         top
    bench (benchmarks, load generators, simulations)
    engine | services.gateway | services.chunker | operators    the parts: none imports another
    common (tokenizer, model sources, Redis contracts, padding, tracing, metrics, ZMQ)
    proto                                     bottom

The imports are read from the source (every `import` and `from ... import` anywhere in a
module, also inside functions), so a lazy import counts as much as a top-level one.
"""

import ast
import pathlib
import subprocess
import sys

from tests.helpers.paths import REPO

# package -> its floor; an import may only go to a lower floor or stay in its own package
FLOORS = {
    "k25": 4,
    "bench": 3,
    "engine": 2,
    "services.gateway": 2,
    "services.chunker": 2,
    "operators": 2,
    "common": 1,
    "proto": 0,
}


# inside the engine, the same rule between its folders: the process (serve/) and the engine
# it serves (llm_engine.py, offline.py) on top, then the model runner, then what the device
# decides, then the core (no torch) beside the model, then attention, the leaves and base/
ENGINE_FLOORS = {
    "engine": 6,  # engine/*.py: llm_engine.py (core over runner), offline.py
    "engine.serve": 6,
    "engine.runner": 5,
    "engine.vllm_core": 5,  # the second backend: the engine-core contract over vLLM, beside K25's runner
    "engine.hardware": 4,
    "engine.structured": 4,
    "engine.kv_tiers": 4,  # KV tiers below the device: host pool, disk files, block copies
    "engine.core": 3,
    "engine.model": 3,
    "engine.attention": 2,
    "engine.lora": 1,
    "engine.quant": 1,
    "engine.kernels": 1,
    "engine.base": 0,
}


def package_of(module: str, floors: dict[str, int] = FLOORS) -> str | None:
    for package in sorted(floors, key=len, reverse=True):
        if module == package or module.startswith(package + "."):
            return package
    return None


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def runtime_modules() -> dict[str, pathlib.Path]:
    modules = {}
    for top in {p.split(".")[0] for p in FLOORS}:
        for path in (REPO / top).rglob("*.py"):
            if not path.name.endswith("_pb2.py"):
                modules[module_name(path)] = path
    return modules


def imports_of(path: pathlib.Path, module: str) -> list[tuple[int, str]]:
    """(line, imported module) for every import in the file, relative ones resolved."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = node.module
            if node.level:  # relative: from the module's own package upwards
                package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            found.append((node.lineno, target))
            # `from engine.lora import slots` imports the module engine.lora.slots
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
    return found


def all_imports() -> dict[str, list[tuple[int, str]]]:
    return {name: imports_of(path, name) for name, path in runtime_modules().items()}


def module_graph() -> dict[str, set[str]]:
    modules = runtime_modules()
    return {name: {t for _, t in found if t in modules and t != name} for name, found in all_imports().items()}


def arrows_against_the_floors(imports: dict[str, list[tuple[int, str]]], floors: dict[str, int] = FLOORS) -> list[str]:
    """One line per import that goes up or sideways between packages, naming the import."""
    wrong = []
    for name, found in sorted(imports.items()):
        source = package_of(name, floors)
        if source is None:
            continue
        for line, target in found:
            destination = package_of(target, floors)
            if destination is not None and destination != source and floors[destination] >= floors[source]:
                wrong.append(f"{name}:{line} imports {target} "
                             f"({source}, floor {floors[source]} -> {destination}, floor {floors[destination]})")
    return sorted(set(wrong))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def package_graph(graph: dict[str, set[str]], depth_of) -> dict[str, set[str]]:
    folded: dict[str, set[str]] = {}
    for source, targets in graph.items():
        for target in targets:
            a, b = depth_of(source), depth_of(target)
            if a != b:
                folded.setdefault(a, set()).add(b)
    return folded


def folder_of(module: str) -> str:
    """The folder (sub-package) a module's file lies in: engine.lora.slots -> engine.lora."""
    path = runtime_modules()[module]
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def test_every_import_between_parts_points_down():
    wrong = arrows_against_the_floors(all_imports())
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_every_import_between_the_engines_folders_points_down():
    engine_imports = {name: found for name, found in all_imports().items() if name.startswith("engine.")}
    wrong = arrows_against_the_floors(engine_imports, ENGINE_FLOORS)
    assert not wrong, "imports against the engine's layering:\n" + "\n".join(wrong)


def test_every_folder_of_the_engine_has_a_floor():
    folders = {folder_of(name) for name in runtime_modules() if name.startswith("engine.")}
    assert folders <= set(ENGINE_FLOORS), f"engine folders without a floor: {sorted(folders - set(ENGINE_FLOORS))}"


# what the process around an engine (engine/serve/) may import of the engine: the contract and
# the messages it carries, never the engine's internals, so a second backend plugs in beneath it
SERVE_MAY_IMPORT = ("engine.serve", "engine.core.contract", "engine.core.request", "engine.core.sampling_params",
                    "engine.core.sequence", "engine.base", "engine.lora.adapter")


def test_the_engines_server_talks_to_the_engine_core_contract_only():
    wrong = [f"{name}:{line} imports {target}" for name, found in sorted(all_imports().items())
             if name.startswith("engine.serve.") for line, target in found
             if target.startswith("engine.") and not target.startswith(SERVE_MAY_IMPORT)]
    assert not wrong, "engine/serve/ reaching past the engine-core contract:\n" + "\n".join(wrong)
    reaching = [path.name for path in (REPO / "engine" / "serve").glob("*.py")
                if any(word in path.read_text() for word in (".block_manager", ".scheduler", ".runner", ".executor"))]
    assert not reaching, f"engine/serve/ reaching into the engine's internals: {reaching}"


def test_the_engine_core_imports_no_torch():
    """The core (requests, scheduling, KV blocks, outputs) is plain Python; only the runner
    below it touches the device. Imported in a fresh interpreter, so nothing else loaded torch."""
    core = sorted(name for name in runtime_modules() if name.startswith("engine.core."))
    script = f"import sys\nfor m in {core!r}: __import__(m)\nprint('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False", f"importing {core} imported torch"


def test_no_module_imports_itself_in_a_circle():
    found = cycles(module_graph())
    assert not found, "import cycles between modules:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_circle_between_packages_at_any_depth():
    graph = module_graph()
    found = cycles(package_graph(graph, folder_of))
    assert not found, "import cycles between folders:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_check_names_each_arrow_against_the_floors_and_no_other():
    imports = {
        "engine.serve.server": [(3, "proto.k25_pb2"), (4, "common.zmq_router"), (9, "services.gateway.routing")],
        "common.padding": [(7, "engine.base.config"), (8, "numpy")],
        "services.gateway.service": [(2, "services.gateway.routing"), (5, "services.chunker.wire")],
        "k25.commands.up": [(1, "bench.serve"), (2, "engine.serve.server")],
    }
    assert arrows_against_the_floors(imports) == [
        "common.padding:7 imports engine.base.config (common, floor 1 -> engine, floor 2)",
        "engine.serve.server:9 imports services.gateway.routing (engine, floor 2 -> services.gateway, floor 2)",
        "services.gateway.service:5 imports services.chunker.wire (services.gateway, floor 2 -> services.chunker, floor 2)",
    ]


def test_the_cycle_finder_finds_a_circle_and_only_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
