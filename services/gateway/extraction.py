"""Fields extracted from a document, each with the passages and the clause it came from: the
pure part of `POST /v1/documents/extract` (the route is document_extract.py).

An extraction schema is an object schema, one property per field. Each field's passages are
ranked by its name and description (passage_ranker.py), and each of the best few is read for
that field alone, in two steps: a note, as a question about the passage would take (what in
it bears on the field), then the value, decoded under a constraint that admits only the
passage's own words and numbers (quote_grammar.py), or the field's JSON schema where no
grammar can hold it to the passage. A value stands only where the passage it came from
supports it (value_support.py): the field takes the supported value of the best-ranked
passage, and cites every passage read that gave the same. A field that no passage supports
is null: nothing is invented."""

import bisect
import json
import re
from dataclasses import dataclass
from typing import Any

from common.anchors import Anchor
from services.gateway.documents import NOTE_MARK_TOKENS, PROMPT_TOKENS, Passage, map_messages
from services.gateway.errors import OpenAIError, invalid_request
from services.gateway.schema_policy import SchemaRefused, check_schema, subschemas, value_validator
from services.gateway.value_support import Unsupported, same_value, support

# fields one extraction may ask for; each is read from its own passages
MAX_FIELDS = 32
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


@dataclass(frozen=True)
class ExtractField:
    name: str
    schema: Any  # the property's schema
    label: str  # how the prompt names it: its title, or its name in words
    description: str

    @property
    def query(self) -> str:
        """What the passages are ranked by."""
        return f"{self.label} {self.description}".strip()

    @property
    def question(self) -> str:
        """What each passage read for it is asked (its note)."""
        return f"What is the {self.label}" + (f" ({self.description})?" if self.description else "?")


def fields_of(schema: Any) -> list[ExtractField]:
    """The fields of an extraction schema; raises SchemaRefused naming what it cannot be."""
    check_schema(schema)
    properties = schema.get("properties")
    if schema.get("type") != "object" or not isinstance(properties, dict) or not properties:
        raise SchemaRefused('an extraction schema is an object schema, {"type": "object", "properties": {...}}, '
                            "with one property per field to extract")
    if len(properties) > MAX_FIELDS:
        raise SchemaRefused(f"the schema has {len(properties)} fields; an extraction takes at most {MAX_FIELDS}")
    for where, node in subschemas(schema):
        if isinstance(node, dict) and _allows_boolean(node):
            raise SchemaRefused(f"{where} admits a boolean, which cannot be checked against the text it would cite; "
                                "ask for the words instead (a string, or an enum of strings)")
        if isinstance(node, dict) and "patternProperties" in node:
            raise SchemaRefused(f"{where} uses patternProperties, which an extraction does not take: name each "
                                "property")
    return [ExtractField(name, sub, _label(name, sub), _text(sub, "description")) for name, sub in properties.items()]


def _allows_boolean(node: dict) -> bool:
    types = node.get("type")
    named = types == "boolean" or (isinstance(types, list) and "boolean" in types)
    listed = [*node.get("enum", []), *([node["const"]] if "const" in node else [])]
    return named or any(isinstance(v, bool) for v in listed)


def _text(schema: Any, key: str) -> str:
    value = schema.get(key) if isinstance(schema, dict) else None
    return value.strip() if isinstance(value, str) else ""


def _label(name: str, schema: Any) -> str:
    return _text(schema, "title") or " ".join(_CAMEL.sub(" ", name).replace("_", " ").replace("-", " ").split()).lower()


def answer_schema(field: ExtractField, root: dict) -> dict:
    """What one passage's answer for the field is constrained to; the root's definitions come
    along, so that the field's `$ref`s resolve."""
    schema = {"type": "object", "properties": {"value": {"anyOf": [field.schema, {"type": "null"}]}},
              "required": ["value"], "additionalProperties": False}
    for key in ("$defs", "definitions"):
        if key in root:
            schema[key] = root[key]
    return schema


def too_many_reads(fields: int, per_field: int, limit: int) -> OpenAIError | None:
    """The refusal of an extraction that would read more passages in all than one request may
    fan out to, or None."""
    if fields * per_field <= limit:
        return None
    return invalid_request(f"an extraction may read at most {limit} passages in all (--max-document-passages); "
                           f"{fields} fields x {per_field} passages each is {fields * per_field}", "passages",
                           "too_many_passages")


def value_messages(field: ExtractField, passage: Passage, note: str) -> list[dict]:
    """The passage's note for the field, then the request for its value: the note's prompt
    (map_messages) comes first, so the value's request reuses its KV."""
    return [*map_messages(field.question, passage), {"role": "assistant", "content": note}, {"role": "user", "content": (
        f'Give the {field.label} as JSON, {{"value": ...}}, in the words of the part; '
        '{"value": null} if the part does not state it.'
    )}]


def extraction_cost(passage_tokens: list[int], question_tokens: int, note_max_tokens: int, max_tokens: int) -> int:
    """The most the reads may spend, counted as their engine jobs are (prompt + max_tokens): a
    note per passage read, then its value, whose prompt holds the note's."""
    note = question_tokens + PROMPT_TOKENS + note_max_tokens
    return sum(2 * (tokens + note) + NOTE_MARK_TOKENS + PROMPT_TOKENS + max_tokens for tokens in passage_tokens)


def answered_value(text: str, validator) -> Any:
    """The value a passage's answer gives (None for null), or None when the answer is not one
    (cut short by max_tokens, or outside the field's schema)."""
    try:
        answer = json.loads(text)
    except ValueError:
        return None
    if not validator.is_valid(answer):
        return None
    return answer["value"]


def answer_validator(schema: dict):
    return value_validator(schema)


@dataclass(frozen=True)
class Reading:
    passage: Passage
    value: Any  # what the passage's answer gave; None: nothing


def settle(readings: list[Reading]) -> tuple[Any, list[tuple[Passage, list[tuple[int, int]]]]]:
    """The field's value and the passages that support it, each with where in it (character
    spans of the passage) the value's strings and numbers stand: the value of the first
    reading (best passage first) that its passage supports, and every reading that gave the
    same. (None, []) when no passage supports what it gave."""
    supported = []
    for reading in readings:
        if reading.value is None:
            continue
        try:
            supported.append((reading, support(reading.value, reading.passage.text)))
        except Unsupported:
            continue
    if not supported:
        return None, []
    value = supported[0][0].value
    return value, [(reading.passage, spans) for reading, spans in supported if same_value(reading.value, value)]


def citation(passage: Passage, spans: list[tuple[int, int]], anchors: list[Anchor]) -> dict:
    """A passage a value came from: the passage, the document spans where the value stands,
    and the clause in force where it starts (the anchors' path there, e.g. "ARTICLE 9 9.1")."""
    where = [[passage.start_char + start, passage.start_char + end] for start, end in spans]
    return passage.citation() | {"clause": clause_at(anchors, where[0][0]), "value_spans": where}


def clause_at(anchors: list[Anchor], char: int) -> str:
    """The path of the last anchor (common/anchors.py) at or before `char`."""
    at = bisect.bisect_right([a.char for a in anchors], char) - 1
    return anchors[at].path if at >= 0 else ""
