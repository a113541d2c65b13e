"""Structured outputs and tool calling through the official `openai` client against a
`k25 up` stack running SmolLM2: answers validate against their schemas (checked by
`jsonschema` and pydantic), tool calls parse and validate, and what K25 cannot honour is a
400 naming the field, before any engine sees it."""

import json

import jsonschema
import openai
import pydantic
import pytest

from services.gateway.tool_grammar import MAX_PARALLEL_CALLS

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"

SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "role": {"enum": ["engineer", "doctor", "teacher"]},
            "email": {"type": ["string", "null"], "maxLength": 40},
        },
        "required": ["name", "age", "role", "email"],
        "additionalProperties": False,
    },
    "order": {
        "type": "object",
        "properties": {
            "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
                "type": "object",
                "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
                               "quantity": {"type": "integer", "minimum": 1, "maximum": 9}},
                "required": ["sku", "quantity"], "additionalProperties": False}},
            "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                         "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                        "required": ["city", "zip"], "additionalProperties": False},
            "express": {"type": "boolean"},
        },
        "required": ["items", "address", "express"],
        "additionalProperties": False,
    },
}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                   "required": ["city"], "additionalProperties": False}}}
ARGUMENTS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}


@pytest.fixture(scope="module")
def client(smollm2_stack):
    """Through tests/gateway/conftest.py's stack, on each backend."""
    return openai.OpenAI(base_url=f"{smollm2_stack.url}/v1", api_key="unused", max_retries=0, timeout=300)


def _ask(name: str) -> list[dict]:
    return [{"role": "user", "content": f"Give me an example {name} as JSON."}]


def _format(name: str) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_answers_validate(client, name, temperature):
    answer = client.chat.completions.create(model=MODEL, messages=_ask(name), response_format=_format(name),
                                            max_tokens=200, temperature=temperature, seed=7)
    assert answer.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(answer.choices[0].message.content), SCHEMAS[name])


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_streamed_json_schema_answers_validate(client, name):
    chunks = list(client.chat.completions.create(model=MODEL, messages=_ask(name), response_format=_format(name),
                                                 max_tokens=200, temperature=0.7, seed=11, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    jsonschema.validate(json.loads(text), SCHEMAS[name])


def test_json_object(client):
    answer = client.chat.completions.create(model=MODEL, messages=_ask("city"), response_format={"type": "json_object"},
                                            max_tokens=120, temperature=0)
    assert answer.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(answer.choices[0].message.content), dict)


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=20)
    country: str = pydantic.Field(max_length=20)
    population: int = pydantic.Field(ge=0, le=50_000_000)


def test_parse_with_a_pydantic_model(client):
    answer = client.chat.completions.parse(model=MODEL, messages=_ask("city"), response_format=City, max_tokens=120,
                                           temperature=0)
    assert answer.choices[0].finish_reason == "stop"
    assert isinstance(answer.choices[0].message.parsed, City)


def _check_calls(calls, names=frozenset(ARGUMENTS)):
    assert calls
    for call in calls:
        assert call.type == "function" and call.id and call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), ARGUMENTS[call.function.name])


WEATHER_QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_required_tool_call(client):
    answer = client.chat.completions.create(model=MODEL, messages=WEATHER_QUESTION, tools=[WEATHER, TIME],
                                            tool_choice="required", parallel_tool_calls=False, max_tokens=100, temperature=0)
    assert answer.choices[0].finish_reason == "tool_calls"
    assert len(answer.choices[0].message.tool_calls) == 1
    _check_calls(answer.choices[0].message.tool_calls)


def _streamed_calls(chunks) -> list:
    """The calls of a streamed answer, folded by index as OpenAI's clients do: a call's first
    delta names it (id, type, name), the later ones carry only more of its arguments."""
    calls = []
    for delta in (call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or ()):
        if delta.index == len(calls):
            assert delta.id and delta.type == "function" and delta.function.name
            calls.append(delta.model_copy(deep=True))
        else:
            assert delta.index == len(calls) - 1 and delta.id is None and delta.function.name is None
            calls[-1].function.arguments += delta.function.arguments
    return calls


def test_required_parallel_tool_calls_streamed_as_the_whole_answer(client):
    request = dict(model=MODEL, messages=WEATHER_QUESTION, tools=[WEATHER, TIME], tool_choice="required",
                   max_tokens=320, temperature=0)
    chunks = list(client.chat.completions.create(**request, stream=True))
    calls = _streamed_calls(chunks)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    assert 1 <= len(calls) <= MAX_PARALLEL_CALLS
    _check_calls(calls)
    whole = client.chat.completions.create(**request).choices[0].message.tool_calls
    assert [(c.function.name, c.function.arguments) for c in calls] == [(c.function.name, c.function.arguments) for c in whole]


def test_named_tool_call_streamed(client):
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=WEATHER_QUESTION, tools=[WEATHER, TIME], max_tokens=150, temperature=0.8, seed=5,
        tool_choice={"type": "function", "function": {"name": "get_time"}}, stream=True))
    calls = _streamed_calls(chunks)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    assert len(calls) == 1
    _check_calls(calls, {"get_time"})


def test_auto_answers_in_text_or_valid_calls(client):
    answer = client.chat.completions.create(model=MODEL, messages=WEATHER_QUESTION, tools=[WEATHER, TIME],
                                            max_tokens=150, temperature=0)
    choice = answer.choices[0]
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls"
        _check_calls(choice.message.tool_calls)
    else:
        assert choice.message.content and choice.finish_reason in ("stop", "length")


def test_round_trip_with_a_tool_message(client):
    first = client.chat.completions.create(model=MODEL, messages=WEATHER_QUESTION, tools=[WEATHER],
                                           tool_choice="required", parallel_tool_calls=False, max_tokens=100, temperature=0)
    call = first.choices[0].message.tool_calls[0]
    history = [*WEATHER_QUESTION, first.choices[0].message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "clear"})}]
    second = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], max_tokens=40,
                                            temperature=0, tool_choice="none")
    assert second.choices[0].message.content and second.choices[0].finish_reason in ("stop", "length")


BAD_REQUESTS = {
    "invalid schema": ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "strng"}}}}}},
        "response_format.json_schema.schema", "strng"),
    "unsupported keyword": ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"not": {"type": "string"}}}}}}},
        "response_format.json_schema.schema", "'not'"),
    "too large to compile": ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"enum": [f"value number {i}" for i in range(20000)]}}}},
        "response_format.json_schema.schema", "bytes"),
    "1000 tools": ({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(1000)]},
                   "tools", "at most 128"),
    "tool message without a call": ({"messages": [{"role": "user", "content": "hi"},
                                                  {"role": "tool", "tool_call_id": "call_x", "content": "42"}]},
                                    "messages[1].tool_call_id", "call_x"),
    "named tool not among tools": ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
                                   "tool_choice", "nope"),
    "functions": ({"functions": [{"name": "f"}]}, "functions", "use tools"),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_what_cannot_be_honoured_is_a_fast_400_naming_the_field(client, case):
    extra, param, words = BAD_REQUESTS[case]
    body = {"messages": [{"role": "user", "content": "hi"}], **extra}
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, max_tokens=5, **body)
    error = refused.value.body
    assert error["param"] == param and words in error["message"], error
    # the engine serves on
    assert client.chat.completions.create(model=MODEL, messages=WEATHER_QUESTION, max_tokens=2).choices[0].message.content


def test_logit_bias_and_penalties_reach_the_engine(client):
    forced = client.chat.completions.create(model=MODEL, messages=WEATHER_QUESTION, max_tokens=4, temperature=0,
                                            logit_bias={"330": 100}, logprobs=True)
    assert [t.token for t in forced.choices[0].logprobs.content] == [forced.choices[0].logprobs.content[0].token] * 4
    plain = client.chat.completions.create(model=MODEL, messages=WEATHER_QUESTION, max_tokens=24, temperature=0)
    penalised = client.chat.completions.create(model=MODEL, messages=WEATHER_QUESTION, max_tokens=24, temperature=0,
                                               frequency_penalty=2.0, presence_penalty=2.0, extra_body={"repetition_penalty": 1.5})
    assert penalised.choices[0].message.content != plain.choices[0].message.content
