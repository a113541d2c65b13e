"""Writes the chart's parts that name engine settings from their one declaration
(common/engine_settings.py): the EnginePool CRD's fields, each pool's and `engine`'s properties
in values.schema.json, `engine`'s lines in values.yaml and the template's list of fields.

`make engine-settings` (this file with --write) rewrites them; tests/common/test_engine_settings.py
fails while any of them differs from what this renders. Only the marked or anchored regions
change; the rest of each file is written by hand."""

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.engine_settings import SETTINGS, EngineSetting

CHART = ROOT / "charts" / "k25"
CRD = CHART / "crds" / "enginepool.yaml"
VALUES = CHART / "values.yaml"
SCHEMA = CHART / "values.schema.json"
TEMPLATE = CHART / "templates" / "_engine_settings.tpl"
BEGIN = "# engine settings: written by `make engine-settings` from common/engine_settings.py"
END = "# end of the engine settings"
# values.schema.json cannot hold comments: its settings are the lines between these two keys
SCHEMA_ANCHORS = (("lora", "drainTimeoutSeconds"), ("lora", "pools"))


def _text(value) -> str:
    """A default or bound as YAML and prose write it: 0.9, 512, true, auto."""
    if isinstance(value, float):
        return f"{value:g}"
    return value if isinstance(value, str) else json.dumps(value)


def _bounds(setting: EngineSetting, openapi: bool) -> dict:
    """The JSON-schema constraints: OpenAPI v3.0 (the CRD) writes an exclusive minimum as a flag on
    minimum, JSON Schema draft 7 (the chart) as a number."""
    bounds = {}
    if setting.choices:
        bounds["enum"] = list(setting.choices)
    if setting.pattern:
        bounds["pattern"] = setting.pattern
    if setting.minimum is not None:
        if not setting.exclusive_minimum:
            bounds["minimum"] = setting.minimum
        elif openapi:
            bounds.update(exclusiveMinimum=True, minimum=setting.minimum)
        else:
            bounds["exclusiveMinimum"] = setting.minimum
    if setting.maximum is not None:
        bounds["maximum"] = setting.maximum
    return {key: int(v) if isinstance(v, float) and v.is_integer() else v for key, v in bounds.items()}


def _flag_words(setting: EngineSetting) -> str:
    if setting.kind == "boolean":
        return f"{setting.flag}, false: --no-{setting.flag[2:]}"
    return setting.flag


def _default_words(setting: EngineSetting) -> str:
    return "the engine's default" + ("" if setting.default is None else f", {_text(setting.default)}")


def crd_field(setting: EngineSetting) -> dict:
    field = {"type": setting.kind, **_bounds(setting, openapi=True)}
    if setting.kind == "boolean":
        field["default"] = setting.default
    field["description"] = f"{setting.help} ({_flag_words(setting)}; absent: {_default_words(setting)})"
    return field


def pool_property(setting: EngineSetting) -> dict:
    return {"type": setting.kind, **_bounds(setting, openapi=False),
            "description": f"{setting.help} ({_flag_words(setting)}; absent: engine.{setting.field})"}


def engine_property(setting: EngineSetting) -> dict:
    bounds = _bounds(setting, openapi=False)
    if "enum" in bounds:
        bounds["enum"] = [*bounds["enum"], None]
    return {"type": [setting.kind, "null"], **bounds,
            "description": f"every pool's {setting.field} unless it sets its own; null: {_default_words(setting)}"}


def _yaml_block(fields: dict, indent: int) -> list[str]:
    """A mapping of flat schemas as YAML, scalars written as JSON (which YAML reads)."""
    pad = " " * indent
    lines = []
    for name, schema in fields.items():
        lines.append(f"{pad}{name}:")
        for key, value in schema.items():
            if key == "enum":
                shown = "[" + ", ".join(value) + "]"
            elif key == "pattern":
                shown = "'" + value.replace("'", "''") + "'"
            else:
                shown = json.dumps(value) if key == "description" else _text(value)
            lines.append(f"{pad}  {key}: {shown}")
    return lines


def render_crd(text: str) -> str:
    return _replace_marked(text, lambda pad: _yaml_block({s.field: crd_field(s) for s in SETTINGS}, pad), CRD)


def render_values(text: str) -> str:
    def block(pad: int) -> list[str]:
        return [f"{' ' * pad}{s.field}: null  # {_flag_words(s)}; null: {_default_words(s)}" for s in SETTINGS]
    return _replace_marked(text, block, VALUES)


def render_schema(text: str) -> str:
    lines = text.split("\n")
    for (after, before), render in zip(SCHEMA_ANCHORS, (pool_property, engine_property)):
        start, end, pad = _anchored(lines, after, before)
        lines[start:end] = [f'{pad}"{s.field}": {json.dumps(render(s), ensure_ascii=False, separators=(", ", ": "))},'
                            for s in SETTINGS]
    return "\n".join(lines)


def render_template() -> str:
    fields = " ".join(s.field for s in SETTINGS)
    return (f"{{{{/* {BEGIN[2:]}: the EnginePool fields every pool may set and `engine` sets for all */}}}}\n"
            f'{{{{- define "k25.engineSettingFields" -}}}}{fields}{{{{- end -}}}}\n')


def _replace_marked(text: str, block, path: Path) -> str:
    lines = text.split("\n")
    starts = [i for i, line in enumerate(lines) if line.strip() == BEGIN]
    ends = [i for i, line in enumerate(lines) if line.strip() == END]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise SystemExit(f"{path}: expected one '{BEGIN}' line and one '{END}' line after it")
    pad = len(lines[starts[0]]) - len(lines[starts[0]].lstrip())
    lines[starts[0] + 1:ends[0]] = block(pad)
    return "\n".join(lines)


def _key(line: str) -> str | None:
    match = re.match(r'\s*"([^"]+)":', line)
    return match and match.group(1)


def _anchored(lines: list[str], after: str, before: str) -> tuple[int, int, str]:
    """The lines strictly between a line whose key is `after` and the next one at its indent whose
    key is `before`, with nothing shallower between (one object's properties)."""
    for i, line in enumerate(lines):
        if _key(line) != after:
            continue
        pad = line[:len(line) - len(line.lstrip())]
        for j in range(i + 1, len(lines)):
            if not lines[j].startswith(pad) or lines[j][len(pad)] in "}]":
                break
            if lines[j].startswith(pad + '"') and _key(lines[j]) == before:
                return i + 1, j, pad
    raise SystemExit(f"{SCHEMA}: no object whose properties hold {after!r} and later {before!r}")


def rendered() -> dict[Path, str]:
    """Each file as this table writes it."""
    return {CRD: render_crd(CRD.read_text()), VALUES: render_values(VALUES.read_text()),
            SCHEMA: render_schema(SCHEMA.read_text()), TEMPLATE: render_template()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the stale files (default: list them, exit 1)")
    args = parser.parse_args(argv)
    stale = [path for path, text in rendered().items() if not path.exists() or path.read_text() != text]
    for path in stale:
        if args.write:
            path.write_text(rendered()[path])
        print(f"{'wrote' if args.write else 'stale'}: {path.relative_to(ROOT)}")
    return 0 if args.write or not stale else 1


if __name__ == "__main__":
    sys.exit(main())
