"""Constrained decoding in the engine with SmolLM2: a constrained row's answer matches its
constraint and ends with STOP only where the grammar accepts, while the free rows batched
with it answer exactly as they do alone; a constraint that does not compile fails its own
request only; the wire carries the constraint."""

import json
import re

import jsonschema
import pytest

from engine.base.config import EngineConfig
from engine.base.errors import EngineError, ErrorCode
from engine.core.sampling_params import Constraint, SamplingParams
from engine.core.sequence import FinishReason
from engine.llm_engine import LLMEngine
from engine.offline import generate
from engine.serve.wire import sampling_from_proto
from proto import k25_pb2

pytestmark = pytest.mark.slow

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 16},
    "age": {"type": "integer", "minimum": 18, "maximum": 99},
    "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "minItems": 1, "maxItems": 2},
    "nickname": {"type": ["string", "null"], "maxLength": 10}},
    "required": ["name", "age", "pets", "nickname"], "additionalProperties": False}


@pytest.fixture(scope="module")
def engine(smollm2):
    return LLMEngine(smollm2, EngineConfig(chunk_size=64))


@pytest.fixture(scope="module")
def prompt(smollm2):
    return smollm2.tokenizer.encode_chat([{"role": "user", "content": "Describe a person in JSON."}])


def test_constrained_and_free_rows_in_one_batch(engine, prompt):
    schema = Constraint("json_schema", json.dumps(SCHEMA))
    free = SamplingParams(max_tokens=12)
    alone = generate(engine, [prompt], free)[0]
    mixed = generate(engine, [prompt, prompt, prompt], [
        SamplingParams(max_tokens=120, constraint=schema), free,
        SamplingParams(max_tokens=120, temperature=1.0, seed=1, constraint=schema)])
    for answer in (mixed[0], mixed[2]):
        assert answer.finish_reason is FinishReason.STOP
        jsonschema.validate(json.loads(answer.text), SCHEMA)
    assert mixed[1].token_ids == alone.token_ids  # the masks touch only their own rows


def test_a_regex_constraint(engine, prompt):
    answer = generate(engine, [prompt], SamplingParams(max_tokens=20, constraint=Constraint("regex", r"[A-Z][a-z]{2,6} [0-9]{2}")))[0]
    assert answer.finish_reason is FinishReason.STOP and re.fullmatch(r"[A-Z][a-z]{2,6} [0-9]{2}", answer.text)


def test_a_constraint_that_does_not_compile_fails_only_its_request(engine, prompt):
    bad, good = generate(engine, [prompt, prompt], [
        SamplingParams(max_tokens=5, constraint=Constraint("json_schema", '{"type": "strng"}')),
        SamplingParams(max_tokens=5)])
    assert bad.finish_reason is FinishReason.ERROR and bad.last.error.code is ErrorCode.INVALID_ARGUMENT
    assert "strng" in bad.last.error.message
    assert good.finish_reason is FinishReason.LENGTH and len(good.token_ids) == 5


def test_the_wire_carries_the_constraint():
    sampling = k25_pb2.SamplingParams(max_tokens=3, constraint=k25_pb2.Constraint(regex="a+"))
    assert sampling_from_proto(sampling).constraint == Constraint("regex", "a+")
    assert sampling_from_proto(k25_pb2.SamplingParams(max_tokens=3)).constraint is None
    with pytest.raises(EngineError, match="empty"):
        sampling_from_proto(k25_pb2.SamplingParams(max_tokens=3, constraint=k25_pb2.Constraint()))
    with pytest.raises(EngineError, match="constraint kind"):
        SamplingParams(constraint=Constraint("gbnf", "x")).validate(100)
