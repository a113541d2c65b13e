"""Extraction as plain functions: what an extraction schema may be, where a value stands in a
passage (or that it does not), which value a field takes and what it cites, the clause in force
at a place of the contract, and the grammars that hold an answer to its passage's own words
(compiled and run by llguidance against the real SmolLM2 tokenizer)."""

import json

import jsonschema
import llguidance
import pytest

from common.constraint_grammar import compile_error, grammar_of, ll_tokenizer_of
from common.tokenizer import load_tokenizer
from common.anchors import find_anchors
from services.gateway.documents import Passage
from services.gateway.extraction import (
    MAX_FIELDS,
    Reading,
    answer_schema,
    answer_validator,
    answered_value,
    citation,
    clause_at,
    fields_of,
    settle,
    too_many_reads,
)
from services.gateway.quote_grammar import quote_grammar
from services.gateway.schema_policy import SchemaRefused
from services.gateway.value_support import Unsupported, numbers_in, same_value, support
from tests.helpers.paths import CONTRACTS

CONTRACT = (CONTRACTS / "en_master_services_agreement.txt").read_text()
CLAUSE = ("9.1 Governing Law. This Agreement is governed by the laws of the State of Delaware, without regard to its "
          "conflict of laws principles. Fees of $1,250,000.00 are due within thirty (30) days.")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("smollm2-135m")


@pytest.fixture(scope="module")
def ll(tokenizer):
    return ll_tokenizer_of(tokenizer)


# --- the schema --------------------------------------------------------------------------

def test_each_property_is_a_field_named_by_its_title_or_its_name_in_words():
    fields = fields_of({"type": "object", "properties": {
        "governing_law": {"type": "string", "description": "the state whose laws govern it"},
        "noticePeriod": {"type": "string", "title": "Notice for price changes"}}})
    assert [(f.name, f.label) for f in fields] == [("governing_law", "governing law"),
                                                   ("noticePeriod", "Notice for price changes")]
    assert fields[0].query == "governing law the state whose laws govern it"
    assert fields[0].question == "What is the governing law (the state whose laws govern it)?"


@pytest.mark.parametrize("schema, words", [
    ({"type": "string"}, "one property per field"),
    ({"type": "object", "properties": {}}, "one property per field"),
    ({"type": "object", "properties": {f"f{i}": {"type": "string"} for i in range(MAX_FIELDS + 1)}},
     f"at most {MAX_FIELDS}"),
    ({"type": "object", "properties": {"renews": {"type": "boolean"}}}, "#/properties/renews admits a boolean"),
    ({"type": "object", "properties": {"x": {"type": ["string", "boolean"]}}}, "admits a boolean"),
    ({"type": "object", "properties": {"x": {"enum": ["yes", False]}}}, "admits a boolean"),
    ({"type": "object", "properties": {"x": {"type": "string", "uniqueItems": True}}}, "does not support"),
    ({"type": "object", "properties": {"x": {"type": "object", "patternProperties": {"^a": {"type": "string"}}}}},
     "#/properties/x uses patternProperties"),
])
def test_what_cannot_be_extracted_is_refused_naming_it(schema, words):
    with pytest.raises(SchemaRefused, match=words):
        fields_of(schema)


def test_a_field_s_answer_is_its_schema_or_null_with_the_root_s_definitions():
    root = {"type": "object", "properties": {"party": {"$ref": "#/$defs/party"}}, "$defs": {"party": {"type": "string"}}}
    schema = answer_schema(fields_of(root)[0], root)
    check = answer_validator(schema)
    assert check.is_valid({"value": "Acme"}) and check.is_valid({"value": None})
    assert not check.is_valid({"value": 3}) and not check.is_valid({})
    assert answered_value('{"value": "Acme"}', check) == "Acme"
    assert answered_value('{"value": "Ac', check) is None  # cut short by max_tokens
    assert answered_value('{"value": 3}', check) is None


def test_the_reads_of_an_extraction_are_bounded_in_all():
    assert too_many_reads(4, 8, 32) is None
    refused = too_many_reads(5, 8, 32)
    assert refused.status == 400 and refused.param == "passages" and refused.code == "too_many_passages"
    assert "--max-document-passages" in refused.message and "5 fields x 8 passages each is 40" in refused.message


# --- where a value stands ----------------------------------------------------------------

@pytest.mark.parametrize("value, quoted", [
    ("the State of Delaware", ["the State of Delaware"]),
    ("STATE OF  DELAWARE.", ["State of Delaware"]),  # case, spaces and the edges' punctuation
    (1250000, ["1,250,000.00"]),
    (30, ["30"]),
    (["Delaware", 30], ["Delaware", "30"]),
    ({"law": "Delaware", "days": {"n": 30}}, ["Delaware", "30"]),
])
def test_a_value_stands_where_its_strings_and_numbers_occur(value, quoted):
    assert [CLAUSE[start:end] for start, end in support(value, CLAUSE)] == quoted


@pytest.mark.parametrize("value", ["Ohio", "Delawar", "laws of Delaware", 31, 3, 1250, True, "", " . ", [], None,
                                   ["Delaware", "Ohio"]])
def test_a_value_the_passage_does_not_hold_is_not_supported(value):
    with pytest.raises(Unsupported):
        support(value, CLAUSE)


def test_chinese_is_found_whatever_touches_it():
    text = "注册资本为人民币5,000万元；转让方持有目标公司24%的股权"
    assert [text[a:b] for a, b in support(["目标公司", 5000, 24], text)] == ["目标公司", "5,000", "24"]
    assert numbers_in(text) == [5000, 24]


def test_values_are_the_same_when_they_read_the_same():
    assert same_value("State of Delaware", " state of  delaware.") and same_value(30, 30.0)
    assert not same_value("Delaware", "Ohio") and not same_value(["a", "b"], ["a"])


# --- which value a field takes, and what it cites ----------------------------------------

def passage(index: int, text: str, start: int = 0) -> Passage:
    return Passage(index, f"Part {index}", start, start + len(text), text)


def test_the_best_passage_s_supported_value_wins_and_every_passage_that_gave_it_is_cited():
    readings = [Reading(passage(3, "Governed by the laws of Ohio."), "Delaware"),  # not in its passage
                Reading(passage(1, "no value here"), None),
                Reading(passage(7, "the laws of the State of Delaware"), "State of Delaware"),
                Reading(passage(2, "Delaware: the State of Delaware."), "state of delaware."),
                Reading(passage(5, "Ohio law applies."), "Ohio")]
    value, cited = settle(readings)
    assert value == "State of Delaware" and [p.index for p, _ in cited] == [7, 2]


def test_a_field_no_passage_supports_is_null_and_cites_nothing():
    assert settle([Reading(passage(1, "Ohio law applies."), "Delaware"), Reading(passage(2, "x"), None)]) == (None, [])


def test_a_citation_names_the_clause_in_force_where_the_value_stands():
    start = CONTRACT.index("ARTICLE 8")  # a passage that opens two articles before the value
    read = passage(4, CONTRACT[start:], start)
    [(_, spans)] = settle([Reading(read, "the State of Delaware")])[1]
    cited = citation(read, spans, find_anchors(CONTRACT))
    assert cited["clause"] == "ARTICLE 9 9.1" and cited["index"] == 4 and cited["anchor"] == "Part 4"
    [[begin, end]] = cited["value_spans"]
    assert CONTRACT[begin:end] == "the State of Delaware"
    assert clause_at(find_anchors(CONTRACT), 0) == "MASTER SERVICES AGREEMENT" and clause_at([], 5) == ""


# --- grammars that hold an answer to its passage ----------------------------------------

def accepts(ll, tokenizer, grammar: str, text: str) -> bool:
    matcher = llguidance.LLMatcher(ll, grammar_of("lark", grammar), log_level=0)
    ids = tokenizer.encode(text, add_special_tokens=False)
    return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()


@pytest.mark.parametrize("schema, held, invented", [
    ({"type": "string"}, ["the State of Delaware", "Fees of $1,250,000.00", "9.1 Governing Law"],
     ["Delaware law", "the State of Ohio", "Delaware.", " the State"]),
    ({"type": ["string", "null"], "maxLength": 10}, ["Delaware"], ["Ohio"]),
    ({"enum": ["Delaware", "Ohio", "New York"]}, ["Delaware"], ["Ohio", "New York"]),
    ({"type": "string", "pattern": "^[0-9]+ days$"}, [], ["30 days"]),  # "thirty (30) days" is not "30 days"
    ({"type": "string", "pattern": "\\(?[0-9]+\\)? days"}, ["(30) days"], ["30 days", "(31) days"]),
    ({"type": "integer", "minimum": 10}, [30, 1250000], [9, 1, 31]),
    ({"type": "array", "items": {"type": "string"}, "maxItems": 2},
     [[], ["Delaware"], ["laws of the State", "thirty (30) days"]], [["Ohio"], ["a", "b", "c"]]),
    ({"type": "array", "items": {"enum": ["Delaware", "Ohio"]}, "minItems": 1}, [["Delaware"]], [[], ["Ohio"]]),
])
def test_a_quote_grammar_admits_the_passage_s_words_and_nothing_else(ll, tokenizer, schema, held, invented):
    grammar = quote_grammar(schema, CLAUSE)
    assert compile_error(grammar_of("lark", grammar), ll) is None
    assert accepts(ll, tokenizer, grammar, '{"value": null}')
    for value in held:
        answer = json.dumps({"value": value}, ensure_ascii=False)
        assert accepts(ll, tokenizer, grammar, answer), answer
        jsonschema.validate(value, schema)
    for value in invented:
        assert not accepts(ll, tokenizer, grammar, json.dumps({"value": value}, ensure_ascii=False)), value


def test_a_quote_grammar_reads_chinese_character_by_character(ll, tokenizer):
    text = "本协议适用中华人民共和国法律。"
    grammar = quote_grammar({"type": "string"}, text)
    assert accepts(ll, tokenizer, grammar, '{"value": "中华人民共和国法律"}')
    assert not accepts(ll, tokenizer, grammar, '{"value": "美国法律"}')


def test_a_passage_that_holds_no_candidate_admits_only_null(ll, tokenizer):
    grammar = quote_grammar({"type": "string", "pattern": "^[A-Z][a-z]+ [0-9]{1,2}, [0-9]{4}$"}, CLAUSE)
    assert accepts(ll, tokenizer, grammar, '{"value": null}')
    assert not accepts(ll, tokenizer, grammar, '{"value": "April 2, 2024"}')


def test_a_pattern_runs_on_re2_whatever_it_is():
    """A pattern that makes a backtracking matcher take exponential time on a run of "a" then a
    "b" is read in linear time; one RE2 does not read is decoded under the field's schema."""
    text = "a" * 5000 + "b"
    check = answer_validator({"type": "object", "properties": {"value": {"type": "string", "pattern": "^(a+)+$"}}})
    assert not check.is_valid({"value": text}) and check.is_valid({"value": "aaa"})
    grammar = quote_grammar({"type": "string", "pattern": "^(a+)+$"}, "a" * 5000 + " b")
    assert grammar.startswith('start: "{\\"value\\": " ("null" | ("\\"' + "a" * 5000 + '\\""))')
    assert quote_grammar({"type": "string", "pattern": "(?=a)b"}, text) is None


@pytest.mark.parametrize("schema", [{"type": "object", "properties": {"a": {"type": "string"}}},
                                    {"$ref": "#/$defs/a"}, {"type": "string", "format": "date"},
                                    {"anyOf": [{"type": "string"}, {"type": "integer"}]}])
def test_a_field_no_grammar_can_hold_is_decoded_under_its_schema(schema):
    assert quote_grammar(schema, CLAUSE) is None
