"""The reference pages read from the chart's schemas: its values from
`charts/k25/values.schema.json` (defaults from `values.yaml`) and the custom resources from
`charts/k25/crds/*.yaml` (docs/gen_reference.py writes the pages)."""

import json
import pathlib
import re

from gen_reference_markdown import HEADER, REGENERATE, cell, code

CHART = pathlib.Path(__file__).resolve().parents[1] / "charts" / "k25"


# ---------------------------------------------------------------- chart values

def chart_page() -> str:
    import yaml

    schema = json.loads((CHART / "values.schema.json").read_text())
    values_text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(values_text)
    definitions = schema.get("definitions", {})
    comments = _values_comments(values_text)
    crd_fields = _crd_spec_descriptions()
    lines = [HEADER.format(cmd=REGENERATE), "# Helm chart values\n\n",
             "Every value of the chart `charts/k25/`, from its `values.schema.json` (which `helm install` "
             "checks: a misspelt key or a wrong type fails with the value's path), with the defaults of "
             "`values.yaml`. Guides: [deploying on a cluster](../getting-started/cluster.md).\n\n"]
    lists: list[tuple[str, dict]] = []
    for key, node in schema["properties"].items():
        rows = list(_schema_rows(key, node, definitions, values.get(key), lists))
        lines.append(f"\n## `{key}`\n\n| value | type | default | meaning |\n|---|---|---|---|\n")
        lines += [f"| `{p}` | {cell(t)} | {cell(d)} | {cell(m or _comment_for(p, comments))} |\n"
                  for p, t, d, m in rows]
    for path, item in lists:
        lines.append(f"\n## Each entry of `{path}` {{#each-entry-of-{_slug(path[:-2])}}}\n\n")
        if item.get("description"):
            lines.append(cell(item["description"]) + ".")
        required = item.get("required", [])
        if required:
            lines.append(" Required keys: " + ", ".join(f"`{r}`" for r in required) + ".")
        lines.append("\n\n| key | type | meaning |\n|---|---|---|\n")
        kind = "enginepools" if path == "engine.pools[]" else "adapterrollouts"
        for key, node in item.get("properties", {}).items():
            for p, t, _, m in _schema_rows(key, node, definitions, None, []):
                lines.append(f"| `{p}` | {cell(t)} | {cell(m or crd_fields.get((kind, p), ''))} |\n")
    return "".join(lines)


def _values_comments(text: str) -> dict[str, str]:
    """value path -> the comment lines right above its key in values.yaml (list items skipped)."""
    found, pending, stack = {}, [], []  # stack: (indent, key) of the enclosing mappings
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        match = re.match(r"^(\s*)([A-Za-z0-9_]+):", line)
        if not match:
            pending = []
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [match.group(2)])
        if pending:
            found[path] = " ".join(pending)
        pending = []
        stack.append((indent, match.group(2)))
    return found


def _comment_for(path: str, comments: dict[str, str]) -> str:
    """A value's own comment in values.yaml; for `x.enabled`, the comment on `x`."""
    if path in comments:
        return comments[path]
    parent, _, leaf = path.rpartition(".")
    return comments.get(parent, "") if leaf == "enabled" else ""


def _crd_spec_descriptions() -> dict[tuple[str, str], str]:
    """(plural, spec field path) -> its description in charts/k25/crds/: a pool's keys are the EnginePool
    spec, a rollout's the AdapterRollout spec."""
    import yaml

    found = {}
    for path in sorted((CHART / "crds").glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd:
                continue
            plural = crd["spec"]["names"]["plural"]
            for version in crd["spec"]["versions"]:
                spec = version["schema"]["openAPIV3Schema"].get("properties", {}).get("spec", {})
                for field, _, _, meaning in _crd_rows("spec", spec, []):
                    if meaning:
                        found[(plural, field.removeprefix("spec."))] = meaning.removeprefix("**required.** ")
    return found


def _resolve(node: dict, definitions: dict) -> dict:
    while "$ref" in node:
        target = definitions[node["$ref"].rsplit("/", 1)[1]]
        extra = {k: v for k, v in node.items() if k != "$ref"}
        node = {**target, **extra}
    return node


def _type_of(node: dict, definitions: dict) -> str:
    node = _resolve(node, definitions)
    if "enum" in node:
        return " | ".join(code(v) for v in node["enum"])
    for combo in ("anyOf", "oneOf"):
        if combo in node:
            return " or ".join(_type_of(n, definitions) for n in node[combo])
    kind = node.get("type", "any")
    kind = " or ".join(kind) if isinstance(kind, list) else kind
    if kind == "array" and "items" in node:
        kind = f"list of {_type_of(node['items'], definitions)}"
    bounds = []
    exclusive_min, exclusive_max = node.get("exclusiveMinimum"), node.get("exclusiveMaximum")
    if "minimum" in node:  # OpenAPI v3 (the CRDs) writes exclusiveMinimum: true beside minimum
        bounds.append(f"{'>' if exclusive_min is True else '≥'} {node['minimum']}")
    if exclusive_min is not None and not isinstance(exclusive_min, bool):
        bounds.append(f"> {exclusive_min}")
    if "maximum" in node:
        bounds.append(f"{'<' if exclusive_max is True else '≤'} {node['maximum']}")
    if exclusive_max is not None and not isinstance(exclusive_max, bool):
        bounds.append(f"< {exclusive_max}")
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def _default_cell(value) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return code(text) if len(text) <= 60 else "see `values.yaml`"


def _schema_rows(path: str, node: dict, definitions: dict, default, lists: list):
    node = _resolve(node, definitions)
    props = node.get("properties")
    if props and node.get("type", "object") == "object":
        for key, child in props.items():
            child_default = default.get(key) if isinstance(default, dict) else None
            yield from _schema_rows(f"{path}.{key}", child, definitions, child_default, lists)
        return
    items = _resolve(node.get("items", {}), definitions) if node.get("type") == "array" else {}
    if items.get("properties") and not items.get("description"):  # a Kubernetes type such as tolerations
        keys = ", ".join(items["properties"])
        yield path, f"list of objects ({keys})", _default_cell(default), node.get("description", "")
        return
    if items.get("properties"):
        lists.append((path + "[]", items))
        default_text = f"{len(default)} entries (see `values.yaml`)" if isinstance(default, list) and default else _default_cell(default)
        yield path, f"list (see [each entry](#each-entry-of-{_slug(path)}))", default_text, node.get("description", "")
        return
    yield path, _type_of(node, definitions), _default_cell(default), node.get("description", "")


def _slug(path: str) -> str:
    return path.lower().replace(".", "")


# ---------------------------------------------------------------- custom resources

def crd_page() -> str:
    import yaml

    lines = [HEADER.format(cmd=REGENERATE), "# Custom resources\n\n",
             "Every field of the custom resources K25 defines, from `charts/k25/crds/*.yaml` (their one copy, "
             "which Helm installs). The API server enforces the types, bounds and rules below; the "
             "operator checks a spec again and reports what it refuses in the resource's status.\n"]
    for path in sorted((CHART / "crds").glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if crd:
                lines.append(_crd_section(crd, path.name))
    return "".join(lines)


def _crd_section(crd: dict, file: str) -> str:
    spec = crd["spec"]
    names = spec["names"]
    out = [f"\n## {names['kind']}\n\n",
           f"`{spec['group']}`, {spec['scope'].lower()}, plural `{names['plural']}`"]
    if names.get("shortNames"):
        out.append(", short name " + ", ".join(f"`{n}`" for n in names["shortNames"]))
    out.append(f"; defined in `charts/k25/crds/{file}`.\n")
    for version in spec["versions"]:
        out.append(f"\n### {names['kind']} {version['name']}\n\n")
        columns = version.get("additionalPrinterColumns", [])
        if columns:
            out.append("`kubectl get` columns: " + ", ".join(
                f"{c['name']}{' (-o wide)' if c.get('priority') else ''}" for c in columns) + ".\n\n")
        schema = version["schema"]["openAPIV3Schema"]
        rows = []
        for top in ("spec", "status"):
            if top in schema.get("properties", {}):
                rows += list(_crd_rows(top, schema["properties"][top], schema["properties"][top].get("required", [])))
        if not rows:
            out.append("No schema beyond free-form fields (kopf's own bookkeeping).\n")
            continue
        out.append("| field | type | default | meaning |\n|---|---|---|---|\n")
        for field, kind, default, meaning in rows:
            out.append(f"| `{field}` | {cell(kind)} | {cell(default)} | {cell(meaning)} |\n")
        rules = [(r.get("message") or r["rule"]) for top in ("spec", "status")
                 for r in schema.get("properties", {}).get(top, {}).get("x-kubernetes-validations", [])]
        if rules:
            out.append("\nRules the API server checks (CEL), as it words a refusal:\n\n")
            out += [f"- {cell(m)}\n" for m in rules]
    return "".join(out)


def _crd_rows(path: str, node: dict, required_here: list):
    props = node.get("properties")
    if props:
        for key, child in props.items():
            yield from _crd_rows(f"{path}.{key}", child, node.get("required", []))
        if path.count(".") > 0:
            return
        return
    if node.get("type") == "array" and node.get("items", {}).get("properties"):
        yield path, "list of objects", "", node.get("description", "")
        yield from _crd_rows(f"{path}[]", node["items"], [])
        return
    kind = _type_of(node, {})
    if node.get("x-kubernetes-int-or-string"):
        kind = "integer or string"
    if node.get("pattern"):
        kind += f", pattern {code(node['pattern'])}"
    if node.get("x-kubernetes-preserve-unknown-fields") and not props:
        kind = "object (free-form)" if node.get("type") == "object" or "type" not in node else kind
    meaning = node.get("description", "")
    name = path.rsplit(".", 1)[-1].rstrip("[]")
    if name in required_here:
        meaning = ("**required.** " + meaning).strip()
    default = code(node["default"]) if "default" in node else ""
    yield path, kind, default, meaning
