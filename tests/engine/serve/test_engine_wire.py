"""engine.serve.wire: proto <-> engine conversions, without any socket."""

import math

import pytest

from engine.base.errors import EngineError, ErrorCode
from engine.core.request import RequestOutput, Timings, Usage
from engine.core.sampling_params import SampledToken
from engine.core.sequence import FinishReason
from engine.serve.wire import (
    decode_client_message,
    engine_frame,
    error_message,
    messages_from_output,
    request_from_proto,
    request_id_of,
)
from proto import k25_pb2


def generate_request(**sampling) -> k25_pb2.GenerateRequest:
    return k25_pb2.GenerateRequest(
        request_id="r1",
        tenant="acme",
        model="tiny-random",
        prompt_token_ids=[5, 6, 7, 0],
        pad_length=1,
        chunk_size=4,
        sampling=k25_pb2.SamplingParams(**sampling),
    )


def kinds(messages) -> list[str]:
    return [m.WhichOneof("kind") for m in messages]


def test_request_fields_carry_over():
    request = generate_request(temperature=0.5, top_p=0.9, top_k=40, seed=7, max_tokens=12, stop_token_ids=[2], stop=["\n"], ignore_eos=True, logprobs=3)
    request.deadline_unix_s = 1.9e9
    converted = request_from_proto(request)
    assert converted.request_id == "r1"
    assert converted.prompt_token_ids == [5, 6, 7, 0]
    assert (converted.pad_length, converted.chunk_size, converted.deadline) == (1, 4, 1.9e9)
    s = converted.sampling
    assert s.temperature == 0.5 and math.isclose(s.top_p, 0.9, rel_tol=1e-6) and s.top_k == 40
    assert (s.seed, s.max_tokens, s.stop_token_ids, s.stop, s.ignore_eos, s.logprobs) == (7, 12, (2,), ("\n",), True, 3)


def test_proto3_zero_defaults_mean_off():
    converted = request_from_proto(generate_request(max_tokens=4))
    s = converted.sampling
    assert (s.temperature, s.top_p, s.top_k, s.seed, s.logprobs) == (0.0, 1.0, 0, None, None)
    assert converted.deadline is None


def test_seed_zero_is_a_seed_not_absent():
    assert request_from_proto(generate_request(seed=0, max_tokens=1)).sampling.seed == 0


def test_a_delta_then_a_final_with_usage_and_timings():
    output = RequestOutput(
        "r1", token_ids=[42], text="hi", finish_reason=FinishReason.LENGTH,
        usage=Usage(3, 5, 1), timings=Timings(0.1, 0.2, 0.3, 1, 0),
    )
    delta, final = messages_from_output(output)
    assert (list(delta.delta.token_ids), delta.delta.text, delta.delta.request_id) == ([42], "hi", "r1")
    assert final.final.finish_reason == k25_pb2.LENGTH
    assert (final.final.usage.prompt_tokens, final.final.usage.completion_tokens, final.final.usage.pad_tokens) == (3, 5, 1)
    assert final.final.timings.total_s == pytest.approx(0.3)
    assert final.final.timings.prefill_chunks == 1


def test_the_final_says_which_kv_tier_held_the_cached_prompt():
    usage = Usage(100, 2, 0, cached_tokens=64, host_cached_tokens=32, disk_cached_tokens=16)
    _, final = messages_from_output(RequestOutput("r1", token_ids=[7], finish_reason=FinishReason.LENGTH, usage=usage))
    sent = final.final.usage
    assert (sent.cached_tokens, sent.host_cached_tokens, sent.disk_cached_tokens) == (64, 32, 16)


def test_an_unfinished_step_is_one_delta_and_an_empty_one_is_nothing():
    assert kinds(messages_from_output(RequestOutput("r1", token_ids=[1]))) == ["delta"]
    assert messages_from_output(RequestOutput("r1")) == []


def test_an_abort_is_a_final_without_a_delta():
    messages = messages_from_output(RequestOutput("r1", finish_reason=FinishReason.ABORT, usage=Usage(3, 2, 0)))
    assert kinds(messages) == ["final"]
    assert messages[0].final.finish_reason == k25_pb2.ABORT


@pytest.mark.parametrize("code", list(ErrorCode))
def test_engine_errors_map_to_the_proto_code_of_the_same_name(code):
    output = RequestOutput("r1", finish_reason=FinishReason.ERROR, error=EngineError(code, "why"))
    (message,) = messages_from_output(output)
    assert k25_pb2.ErrorCode.Name(message.error.code) == code.name
    assert (message.error.request_id, message.error.message) == ("r1", "why")


def test_a_failed_request_without_an_error_reads_internal():
    (message,) = messages_from_output(RequestOutput("r1", finish_reason=FinishReason.ERROR))
    assert message.error.code == k25_pb2.INTERNAL


def test_logprobs_carry_over():
    token = SampledToken(7, -0.5, ((7, -0.5), (8, -1.5)))
    (message,) = messages_from_output(RequestOutput("r1", token_ids=[7], logprobs=[token]))
    (logprob,) = message.delta.logprobs
    assert (logprob.token_id, logprob.logprob) == (7, -0.5)
    assert [(t.token_id, t.logprob) for t in logprob.top] == [(7, -0.5), (8, -1.5)]


def test_error_message_names_the_request():
    message = error_message("r9", EngineError(ErrorCode.CHUNK_SIZE_MISMATCH, "padded for 64"))
    assert (message.error.request_id, message.error.code, message.error.message) == ("r9", k25_pb2.CHUNK_SIZE_MISMATCH, "padded for 64")


def test_a_frame_is_one_engine_batch_that_round_trips_every_message_in_order():
    token = SampledToken(7, -0.5, ((7, -0.5), (8, -1.5)))
    messages = [
        *messages_from_output(RequestOutput("r1", token_ids=[7], text="x", logprobs=[token])),
        *messages_from_output(RequestOutput("r2", token_ids=[9, 10], text="yz", finish_reason=FinishReason.STOP,
                                            usage=Usage(4, 2, 0), timings=Timings(0.1, 0.2, 0.3, 1, 0))),
        error_message("r3", EngineError(ErrorCode.RESOURCE_EXHAUSTED, "KV full")),
        *messages_from_output(RequestOutput("r1", token_ids=[8])),
    ]
    decoded = k25_pb2.EngineBatch.FromString(engine_frame(messages))
    assert list(decoded.messages) == messages
    assert kinds(decoded.messages) == ["delta", "delta", "final", "error", "delta"]
    assert [getattr(m, m.WhichOneof("kind")).request_id for m in decoded.messages] == ["r1", "r2", "r2", "r3", "r1"]
    assert decoded.messages[0].delta.logprobs[0].top[1].token_id == 8


def test_a_batch_of_one_error_is_a_frame_too():
    error = error_message("", EngineError(ErrorCode.INVALID_ARGUMENT, "not a ClientMessage"))
    (decoded,) = k25_pb2.EngineBatch.FromString(engine_frame([error])).messages
    assert decoded == error


def test_decoding_round_trips_generate_and_cancel():
    generate = k25_pb2.ClientMessage(generate=generate_request(max_tokens=3))
    cancel = k25_pb2.ClientMessage(cancel=k25_pb2.CancelRequest(request_id="r2"))
    assert decode_client_message(generate.SerializeToString()) == generate
    assert request_id_of(decode_client_message(cancel.SerializeToString())) == "r2"


@pytest.mark.parametrize(
    "payload",
    [
        b"",  # a valid, empty ClientMessage: neither generate nor cancel
        b"\x00garbage",  # field number 0 is never valid
        b"\x0a\xff",  # generate whose length runs past the end
        b"\x12\x03\x0a\x01\xff",  # cancel whose request_id is not UTF-8
    ],
)
def test_undecodable_or_empty_frames_are_invalid_argument(payload):
    with pytest.raises(EngineError) as raised:
        decode_client_message(payload)
    assert raised.value.code is ErrorCode.INVALID_ARGUMENT
