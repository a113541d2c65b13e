"""The constraint one passage's answer for a field is decoded under: `{"value": ...}` whose value
can only be taken from the passage, where the field's schema allows that to be built.

- a string: a run of the passage's words, as they follow each other there;
- a string with an `enum`, a `const` or a `pattern`: one of the enum's values, the const, or the
  passage's matches of the pattern, that the passage holds;
- an integer or a number: one of the numbers written in the passage that the schema admits;
- an array of those: a list of them.

Each may be null (the passage does not state it). The grammar is llguidance's Lark; a run of words
is one rule per word of the passage: `first_i` opens a run at word i, `then_i` continues it,
so the grammar grows with the passage, not with the runs it admits. A field of any other
schema (an object, a `format`, a `$ref`, ...) is decoded under its JSON schema, and what it
gives is checked against the passage afterwards (value_support.py). Pure functions."""

import json
import re
from typing import Any


from services.gateway.schema_policy import compiled_pattern, value_validator
from services.gateway.value_support import Unsupported, numbers_in, support

# the passage's words: a CJK character (Chinese has no spaces), a run of letters, of digits, or
# any other character on its own (punctuation), so that a run may stop before a comma
_PIECE = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]|[^\W\d_]+|\d+|\S")
# keywords that only describe, and those a run of words cannot be held to (checked afterwards)
_DESCRIBING = frozenset({"type", "title", "description", "default", "examples", "$comment", "deprecated", "readOnly",
                         "writeOnly"})
_CHECKED_AFTER = frozenset({"minLength", "maxLength"})
_NUMBER_KEYWORDS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})


def quote_grammar(field_schema: Any, passage_text: str) -> str | None:
    """The Lark grammar of the passage's answer for a field of this schema, or None when the
    field's schema is not one a grammar can hold to the passage (decode it under its schema)."""
    value = _value_rule(field_schema, passage_text)
    if value is None:
        return None
    rules, body = value
    answer = f'"null" | {body}' if body is not None else '"null"'
    return "\n".join([f'start: "{{\\"value\\": " ({answer}) "}}"', *rules])


def _value_rule(schema: Any, text: str) -> tuple[list[str], str | None] | None:
    """(rules, the expression of one value, None when the passage holds none) or None when
    no grammar can hold the schema to the passage."""
    if not isinstance(schema, dict):
        return None
    types = _types(schema)
    if types == {"array"} and set(schema) <= _DESCRIBING | {"items", "minItems", "maxItems"}:
        return _array_rule(schema, text)
    if "enum" in schema or "const" in schema:
        return _choices(schema, _enum_values(schema), text)
    if types == {"string"} and "pattern" in schema and set(schema) <= _DESCRIBING | _CHECKED_AFTER | {"pattern"}:
        matches = _pattern_matches(schema["pattern"], text)
        return None if matches is None else _choices(schema, matches, text)
    if types == {"string"} and set(schema) <= _DESCRIBING | _CHECKED_AFTER:
        return _run_rules(text)
    if types and types <= {"integer", "number"} and set(schema) <= _DESCRIBING | _NUMBER_KEYWORDS:
        return _choices(schema, numbers_in(text), text)
    return None


def _types(schema: dict) -> set[str]:
    """The types a schema names, null left out (every answer may be null); empty if it names none."""
    named = schema.get("type")
    names = {named} if isinstance(named, str) else set(named) if isinstance(named, list) else set()
    return names - {"null"}


def _array_rule(schema: dict, text: str) -> tuple[list[str], str] | None:
    item = _value_rule(schema.get("items"), text)
    if item is None:
        return None
    rules, body = item
    least, most = schema.get("minItems", 0), schema.get("maxItems")
    if most is not None and least > most:
        return rules, None
    if body is None or most == 0:
        return rules, '"[]"' if least == 0 else None
    more = f"{{{max(least - 1, 0)},{most - 1}}}" if most is not None else "*"
    items = f'"[" {body} (", " {body}){more} "]"'
    return rules, items if least > 0 else f'("[]" | {items})'


def _enum_values(schema: dict) -> list:
    return [schema["const"]] if "const" in schema else list(schema["enum"])


def _pattern_matches(pattern: str, text: str) -> list[str] | None:
    """The passage's matches of a schema's pattern (anchors dropped to find them; the schema
    checks each), or None for a pattern RE2 does not read. RE2 runs in time linear in the
    passage, whatever the pattern."""
    core = compiled_pattern(pattern.removeprefix("^").removesuffix("$"))
    return None if core is None else [m.group() for m in core.finditer(text) if m.group()]


def _choices(schema: dict, candidates: list, text: str) -> tuple[list[str], str | None]:
    """The candidates the schema admits and the passage holds, as JSON literals (None: none)."""
    check = value_validator(schema)
    held = []
    for candidate in dict.fromkeys(candidates):
        if candidate is None or not check.is_valid(candidate):
            continue
        try:
            support(candidate, text)
        except Unsupported:
            continue
        held.append(_literal(json.dumps(candidate, ensure_ascii=False)))
    return [], ("(" + " | ".join(held) + ")") if held else None


def _run_rules(text: str) -> tuple[list[str], str] | None:
    pieces = list(_PIECE.finditer(text))
    if not pieces:
        return None
    rules = []
    for i, piece in enumerate(pieces):
        word = _escaped(piece.group())
        after = f" then_{i + 1}?" if i + 1 < len(pieces) else ""
        space = " " if piece.start() > 0 and text[piece.start() - 1].isspace() else ""
        rules.append(f"first_{i}: {_literal(word)}{after}")
        rules.append(f"then_{i}: {_literal(space + word)}{after}")
    rules.append("run: " + " | ".join(f"first_{i}" for i in range(len(pieces))))
    return rules, '"\\"" run "\\""'


def _escaped(text: str) -> str:
    """The text as it stands inside a JSON string."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _literal(text: str) -> str:
    """A Lark string literal of the text."""
    return json.dumps(text, ensure_ascii=False)
