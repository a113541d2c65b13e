"""`k25 bench serve --structured`'s workload as plain functions: each body is a request an
OpenAI server takes, answers are judged by jsonschema, streamed calls are folded whole, and the
run reports the share of answers that hold."""

import json

import jsonschema
import numpy as np

from bench.serve import make_workload
from bench.serve_stats import RequestResult, summarize
from bench.serve_structured import SCHEMA_MIX, TOOL_MIX, add_tool_call_deltas, is_valid, structured_body


def test_every_schema_and_tool_of_the_mix_is_a_valid_json_schema():
    for _, schema in SCHEMA_MIX:
        jsonschema.Draft202012Validator.check_schema(schema)
    for tool in TOOL_MIX:
        jsonschema.Draft202012Validator.check_schema(tool["function"]["parameters"])


def test_answers_are_judged_against_their_schema():
    person = structured_body("json", 0)
    assert person["response_format"]["json_schema"]["name"] == "person"
    good = {"name": "Ann", "age": 30, "role": "doctor", "email": None}
    assert is_valid(person, json.dumps(good), [])
    assert not is_valid(person, json.dumps({**good, "age": 300}), [])
    assert not is_valid(person, '{"name": "Ann"', [])
    free = structured_body("free", 0)
    assert "response_format" not in free and is_valid(free, json.dumps(good), [])


def test_tool_answers_need_a_valid_call():
    body = structured_body("tools", 0)
    assert body["tool_choice"] == "required"
    assert is_valid(body, "", [{"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "celsius"}'}])
    assert not is_valid(body, "", [{"name": "get_weather", "arguments": '{"city": "Oslo"}'}])
    assert not is_valid(body, "", [{"name": "nope", "arguments": "{}"}])
    assert not is_valid(body, "It is sunny.", [])


def test_streamed_call_deltas_fold_into_whole_calls():
    calls: list[dict] = []
    add_tool_call_deltas(calls, [{"index": 0, "id": "c", "function": {"name": "get_weather", "arguments": '{"ci'}}])
    add_tool_call_deltas(calls, [{"index": 0, "function": {"arguments": 'ty": "Oslo"}'}}, {"index": 1, "function": {"name": "x"}}])
    assert calls == [{"name": "get_weather", "arguments": '{"city": "Oslo"}'}, {"name": "x", "arguments": ""}]


def test_a_structured_workload_and_its_valid_share():
    specs = make_workload([0.0, 0.1, 0.2], (4, 8), (16, 16), np.random.default_rng(0), "json")
    assert [s.chat["response_format"]["json_schema"]["name"] for s in specs] == [n.replace(" ", "_") for n, _ in SCHEMA_MIX]
    assert all(s.prompt_token_ids == [] for s in specs)
    results = [RequestResult(0, 0, 1, [0.1], 5, valid=True), RequestResult(0, 0, 1, [0.1], 5, valid=False),
               RequestResult(0, 0, 1, error="503")]
    assert summarize(results, 1.0)["valid_share"] == 1 / 3
    assert summarize([RequestResult(0, 0, 1, [0.1], 5)], 1.0)["valid_share"] is None
