"""What a JSON Schema sent for structured output may hold: pure checks, before anything
compiles it. A schema that passes goes on to the grammar compiler (grammar_check.py).

K25 constrains decoding to the schema with llguidance; the keywords below are those it
honours. A keyword outside them would be dropped by the compiler or refused with a message
that names no place in the request, so it is refused here, with its path."""

import functools
import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import re2

# keywords that constrain what the answer may be
CONSTRAINING = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems", "maxItems",
    "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "multipleOf", "minLength", "maxLength", "pattern", "format", "patternProperties", "minProperties",
    "maxProperties",
})
# keywords that hold definitions or only describe
DESCRIBING = frozenset({
    "$defs", "definitions", "$schema", "$id", "$comment", "title", "description", "default", "examples",
    "deprecated", "readOnly", "writeOnly",
})
SUPPORTED = CONSTRAINING | DESCRIBING

# keywords whose value is a map of names to schemas, a schema, or a list of schemas
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SCHEMA_VALUES = ("additionalProperties", "items")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")

# bounds on one schema: what a caller may make the gateway and engine compile
MAX_SCHEMA_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 32
MAX_SCHEMA_NODES = 2000

class SchemaRefused(ValueError):
    """The schema may not be used; the message names where in it and why."""


def check_schema(schema: Any) -> None:
    """Raises SchemaRefused naming the first problem: not an object, too large or deep, an
    unsupported keyword, or a value of the wrong kind."""
    if not isinstance(schema, dict):
        raise SchemaRefused("a schema must be a JSON object")
    size = len(json.dumps(schema, separators=(",", ":")))
    if size > MAX_SCHEMA_BYTES:
        raise SchemaRefused(f"the schema is {size} bytes; at most {MAX_SCHEMA_BYTES} are accepted")
    nodes = 0
    pending = [("#", schema, 0)]
    while pending:
        where, node, depth = pending.pop()
        nodes += 1
        if nodes > MAX_SCHEMA_NODES:
            raise SchemaRefused(f"the schema has more than {MAX_SCHEMA_NODES} subschemas")
        if depth > MAX_SCHEMA_DEPTH:
            raise SchemaRefused(f"the schema nests deeper than {MAX_SCHEMA_DEPTH} levels (at {where})")
        if isinstance(node, bool):
            continue
        if not isinstance(node, dict):
            raise SchemaRefused(f"{where} must be a schema (a JSON object or a boolean)")
        pending.extend(_children(where, node, depth))


def subschemas(schema: Any) -> Iterator[tuple[str, Any]]:
    """Every subschema of one that check_schema accepted, the schema itself first, each with its
    place ("#/properties/parties/items")."""
    pending = [("#", schema, 0)]
    while pending:
        where, node, depth = pending.pop()
        yield where, node
        if isinstance(node, dict):
            pending.extend(_children(where, node, depth))


def _children(where: str, node: dict, depth: int) -> list[tuple[str, Any, int]]:
    unknown = sorted(set(node) - SUPPORTED)
    if unknown:
        raise SchemaRefused(f"{where} uses {_keywords(unknown)} {', '.join(repr(k) for k in unknown)}, which K25 does "
                            f"not support; supported: {', '.join(sorted(CONSTRAINING))}")
    if "required" in node and not (isinstance(node["required"], list) and all(isinstance(r, str) for r in node["required"])):
        raise SchemaRefused(f"{where}/required must be a list of property names")
    if "enum" in node and not (isinstance(node["enum"], list) and node["enum"]):
        raise SchemaRefused(f"{where}/enum must be a non-empty list")
    children = []
    for key in _SCHEMA_MAPS:
        if key in node:
            if not isinstance(node[key], dict):
                raise SchemaRefused(f"{where}/{key} must be an object of schemas")
            children += [(f"{where}/{key}/{name}", inner, depth + 1) for name, inner in node[key].items()]
    for key in _SCHEMA_VALUES:
        if key in node:
            children.append((f"{where}/{key}", node[key], depth + 1))
    for key in _SCHEMA_LISTS:
        if key in node:
            if not isinstance(node[key], list) or not node[key]:
                raise SchemaRefused(f"{where}/{key} must be a non-empty list of schemas")
            children += [(f"{where}/{key}/{i}", inner, depth + 1) for i, inner in enumerate(node[key])]
    return children


def _keywords(names: list[str]) -> str:
    return "the keyword" if len(names) == 1 else "the keywords"


# values the gateway checks against a schema (extracted fields) have their patterns run by RE2,
# in time linear in the value whatever the pattern; a pattern RE2 does not read fails the value
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False


@functools.lru_cache(maxsize=256)
def compiled_pattern(pattern: str):
    """The pattern compiled by RE2 (its `search` and `finditer` as `re`'s), or None when RE2 does not read it."""
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error:
        return None


def _pattern(validator, pattern, instance, schema):
    if validator.is_type(instance, "string"):
        compiled = compiled_pattern(pattern)
        if compiled is None or not compiled.search(instance):
            yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


_ValueValidator = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": _pattern})


def value_validator(schema: dict):
    """A jsonschema validator (Draft 2020-12, llguidance's reading) whose patterns run on RE2.
    `patternProperties` would still run on Python's `re`: keep it out of what this checks."""
    return _ValueValidator(schema)
