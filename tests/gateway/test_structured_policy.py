"""The gateway's structured-output policy as plain functions: what a schema may hold, the
tool-call grammar (compiled and run by llguidance against the real SmolLM2 tokenizer), how
answers are read for calls, and the 400s a request gets before anything is routed."""

import json

import llguidance
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.constraint_grammar import compile_error, grammar_of, ll_tokenizer_of
from common.tokenizer import load_tokenizer
from services.gateway.errors import OpenAIError
from services.gateway.openai_schema import ChatCompletionRequest
from services.gateway.schema_policy import MAX_SCHEMA_BYTES, SchemaRefused, check_schema
from services.gateway.structured_fields import Tool
from services.gateway.structured_request import plan_structured
from services.gateway.tool_calls import ToolCallReader, read_answer
from services.gateway.tool_grammar import MAX_PARALLEL_CALLS, tool_call_grammar
from services.gateway.tool_prompt import template_renders_tools, tool_messages

ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"], "additionalProperties": False}}}
NOW = {"type": "function", "function": {"name": "now"}}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("smollm2-135m")


@pytest.fixture(scope="module")
def ll(tokenizer):
    return ll_tokenizer_of(tokenizer)


def test_a_schema_with_supported_keywords_passes():
    check_schema({"type": "object", "properties": {"a": {"type": ["string", "null"], "maxLength": 3},
                                                   "b": {"$ref": "#/$defs/b"}},
                  "$defs": {"b": {"enum": [1, 2]}}, "required": ["a"], "additionalProperties": False})


@pytest.mark.parametrize("schema, words", [
    ({"type": "object", "properties": {"a": {"not": {}}}}, "#/properties/a uses the keyword 'not'"),
    ({"if": {}, "then": {}}, "the keywords 'if', 'then'"),
    ({"anyOf": []}, "#/anyOf must be a non-empty list"),
    ({"properties": []}, "#/properties must be an object"),
    ({"required": "a"}, "#/required must be a list"),
    ([1], "must be a JSON object"),
    ({"enum": ["x" * 100] * 1000}, f"at most {MAX_SCHEMA_BYTES}"),
])
def test_a_schema_is_refused_naming_where_and_why(schema, words):
    with pytest.raises(SchemaRefused, match=None) as refused:
        check_schema(schema)
    assert words in str(refused.value)


def test_deep_nesting_is_refused():
    schema: dict = {"type": "string"}
    for _ in range(40):
        schema = {"type": "array", "items": schema}
    with pytest.raises(SchemaRefused, match="deeper than"):
        check_schema(schema)


def _accepts(ll, tokenizer, grammar: str, text: str) -> bool:
    matcher = llguidance.LLMatcher(ll, grammar, log_level=0)
    ids = tokenizer.encode(text, add_special_tokens=False)
    return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()


CALL = '<tool_call>\n{"name":"add","arguments":{"a":1,"b":2}}\n</tool_call>'


@pytest.mark.parametrize("free_text, parallel, text, accepted", [
    (False, False, CALL, True),
    (False, False, f"{CALL}\n{CALL}", False),
    (False, True, f"{CALL}\n{CALL}", True),
    (False, True, "Sure: " + CALL, False),
    (False, True, "\n".join([CALL] * MAX_PARALLEL_CALLS), True),
    (False, True, "\n".join([CALL] * (MAX_PARALLEL_CALLS + 1)), False),
    (False, False, '<tool_call>\n{"name":"add","arguments":{"a":1}}\n</tool_call>', False),
    (False, False, '<tool_call>\n{"name":"sub","arguments":{"a":1,"b":2}}\n</tool_call>', False),
    (True, True, "No call needed, 1 < 2.", True),
    (True, True, "Let me add. " + CALL, True),
    (True, True, 'Let me add. <tool_call>\n{"name":"add","arguments":{"a":"x"', False),
])
def test_the_tool_call_grammar(tokenizer, ll, free_text, parallel, text, accepted):
    tools = [Tool.model_validate(ADD), Tool.model_validate(NOW)]
    grammar = grammar_of("lark", tool_call_grammar(tools, parallel, free_text))
    assert compile_error(grammar, ll) is None
    assert _accepts(ll, tokenizer, grammar, text) is accepted


def test_answers_are_read_for_calls_of_known_tools_only():
    content, calls = read_answer(f"Adding. {CALL}\n<tool_call>\nnot json\n</tool_call>", frozenset({"add"}))
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("add", {"a": 1, "b": 2})]
    assert content == "Adding.\n<tool_call>\nnot json\n</tool_call>"
    assert read_answer(CALL, frozenset({"now"})) == (CALL, [])


def test_a_streamed_answer_gives_out_text_then_each_call_piece_by_piece():
    reader = ToolCallReader(frozenset({"add"}))
    pieces = ["Sure <tool", "_call>\n{\"name\":\"add\",", "\"arguments\":{\"a\":1,", "\"b\":2}", "}\n</tool_call>", "\n", CALL]
    given = [reader.push(piece) for piece in pieces] + [reader.finish()]
    assert given[0] == ["Sure"]
    assert given[1] == []  # the head is not whole yet
    head, first = given[2]
    assert (head.index, head.call.name, head.arguments, first.arguments) == (0, "add", "", '{"a":1,')
    assert [d.arguments for d in given[3]] == ['"b":2']  # the brace may still close the block
    assert [d.arguments for d in given[4]] == ["}"]
    assert given[5] == []  # whitespace between calls is not content
    assert [(d.index, d.arguments, d.call is not None) for d in given[6]] == [(1, "", True), (1, '{"a":1,"b":2}', False)]
    assert [json.loads(call.arguments) for call in reader.calls] == [{"a": 1, "b": 2}] * 2
    assert reader.content == "Sure"
    unfinished = ToolCallReader(frozenset({"add"}))
    assert unfinished.push("a <tool_call>\n{") == ["a"]
    assert unfinished.finish() == [" <tool_call>\n{"]


def test_a_call_cut_short_gives_out_the_arguments_it_has():
    reader = ToolCallReader(frozenset({"add"}))
    given = reader.push('<tool_call>\n{"name": "add", "arguments": {"a": 1}') + reader.finish()
    assert "".join(d.arguments for d in given) == '{"a": 1}'


_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=6),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                       max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(calls=st.lists(st.dictionaries(st.text(max_size=4), _VALUES, max_size=3), min_size=1, max_size=3),
       spaced=st.booleans(), lead=st.text(alphabet="ab <>{}\n", max_size=8), data=st.data())
def test_streamed_pieces_join_into_the_whole_answer_s_calls(calls, spaced, lead, data):
    separators = (", ", ": ") if spaced else (",", ":")
    blocks = [f'<tool_call>\n{{"name": "add", "arguments": {json.dumps(c, separators=separators)}}}\n</tool_call>' for c in calls]
    answer = lead + "\n".join(blocks)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(answer)), max_size=12)))
    reader = ToolCallReader(frozenset({"add"}))
    given = [g for a, b in zip([0, *cuts], [*cuts, len(answer)]) for g in reader.push(answer[a:b])] + reader.finish()
    content, whole = read_answer(answer, frozenset({"add"}))
    assert "".join(g for g in given if isinstance(g, str)) == content
    streamed = ["".join(g.arguments for g in given if not isinstance(g, str) and g.index == i) for i in range(len(calls))]
    assert streamed == [call.arguments for call in whole]
    assert [json.loads(text) for text in streamed] == calls


def test_the_default_tool_prompt_writes_calls_and_results_as_text(tokenizer):
    assert not template_renders_tools(tokenizer.chat_template)  # SmolLM2's template knows no tools
    history = [{"role": "user", "content": "1+2?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a":1,"b":2}'}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "3"}]
    rendered = tool_messages(history, [ADD], "hint", native=False)
    assert [m["role"] for m in rendered] == ["system", "user", "assistant", "user"]
    assert '"name": "add"' in rendered[0]["content"] and rendered[0]["content"].endswith("hint")
    assert rendered[2]["content"] == '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    assert rendered[3]["content"] == "<tool_response>\n3\n</tool_response>"
    tokenizer.encode_chat(rendered)


def _plan(tokenizer, **fields):
    body = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields})
    return plan_structured(body, tokenizer.chat_template)


def test_plans(tokenizer):
    assert _plan(tokenizer).constraint is None
    assert _plan(tokenizer, response_format={"type": "json_object"}).constraint.json_schema == '{"type":"object"}'
    required = _plan(tokenizer, tools=[ADD, NOW], tool_choice="required")
    assert required.constraint.lark and required.tool_names == {"add", "now"}
    named = _plan(tokenizer, tools=[ADD, NOW], tool_choice={"type": "function", "function": {"name": "now"}})
    assert named.tool_names == {"now"}
    assert _plan(tokenizer, tools=[ADD], tool_choice="none").tool_names == frozenset()


@pytest.mark.parametrize("fields, param", [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [ADD], "tool_choice": {"type": "function", "function": {"name": "sub"}}}, "tool_choice"),
    ({"tools": [ADD, ADD]}, "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]}, "tools"),
    ({"tools": [ADD], "response_format": {"type": "json_object"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"oneOf": []}}}},
     "response_format.json_schema.schema"),
])
def test_what_cannot_be_honoured_is_refused_naming_the_field(tokenizer, fields, param):
    with pytest.raises(OpenAIError) as refused:
        _plan(tokenizer, **fields)
    assert refused.value.status == 400 and refused.value.param == param


def test_the_gateway_s_compile_check(tokenizer):
    import asyncio

    from proto import k25_pb2
    from services.gateway.grammar_check import GrammarChecker

    checker = GrammarChecker(tokenizer)
    good = k25_pb2.Constraint(json_schema='{"type": "object"}')
    assert asyncio.run(checker.check(good)) is None
    assert asyncio.run(checker.check(good)) is None  # remembered
    assert "strng" in asyncio.run(checker.check(k25_pb2.Constraint(json_schema='{"type": "strng"}')))
    assert asyncio.run(checker.check(k25_pb2.Constraint(json_schema="{")))  # not even JSON
    assert asyncio.run(checker.check(k25_pb2.Constraint())) == "the constraint is empty"
    hurried = GrammarChecker(tokenizer, timeout_s=0)
    assert "did not compile within 0 s" in asyncio.run(hurried.check(k25_pb2.Constraint(regex="a+")))
