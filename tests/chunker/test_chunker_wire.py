"""The chunker's protobuf conversions: decoding, defaults, errors as data."""

import pytest

from proto import k25_pb2
from services.chunker.boundaries import ChunkParams, Passage
from services.chunker.chunker import SplitDocument
from services.chunker.errors import ChunkerError
from services.chunker.wire import build_request, decode_request, document_of, error_response, params_of, response_of

DEFAULTS = ChunkParams(passage_tokens=300, overlap_ratio=0.2, semantic_threshold=0.6)
TRACEPARENT = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"


def test_a_request_round_trips_with_its_trace_context():
    request = build_request("r1", "第一条 总则", 256, 0.1, 0.5, traceparent=TRACEPARENT, tracestate="k25=1")
    decoded = decode_request(request.SerializeToString())
    assert decoded == request
    assert (decoded.trace.traceparent, decoded.trace.tracestate) == (TRACEPARENT, "k25=1")


@pytest.mark.parametrize(
    "payload, fragment",
    [
        (b"\xff\xff\xff\xff garbage", "not a k25.v1.ChunkRequest"),
        (b"", "request_id is empty"),
        (k25_pb2.ChunkRequest(text="no id").SerializeToString(), "request_id is empty"),
        (b"\x12\x02\xc3\x28", "not a k25.v1.ChunkRequest"),  # text field with invalid UTF-8
    ],
)
def test_undecodable_frames_are_invalid_argument(payload, fragment):
    with pytest.raises(ChunkerError) as info:
        decode_request(payload)
    assert info.value.code == "INVALID_ARGUMENT" and fragment in info.value.message


def test_unset_fields_take_the_defaults_and_an_explicit_zero_overlap_is_kept():
    assert params_of(build_request("r", "x"), DEFAULTS) == DEFAULTS
    request = build_request("r", "x", passage_tokens=64, overlap_ratio=0.0, semantic_threshold=0.0)
    assert request.chunk_size == 64  # the wire's name for a passage's token budget
    assert params_of(request, DEFAULTS) == ChunkParams(64, 0.0, 0.0)


@pytest.mark.parametrize(
    "fields, fragment",
    [({"passage_tokens": 8}, "passage_tokens"), ({"overlap_ratio": 0.75}, "overlap_ratio"), ({"semantic_threshold": 2.0}, "semantic_threshold")],
)
def test_bad_parameters_are_invalid_argument(fields, fragment):
    with pytest.raises(ChunkerError) as info:
        params_of(build_request("r", "x", **fields), DEFAULTS)
    assert info.value.code == "INVALID_ARGUMENT" and fragment in info.value.message


def test_a_response_carries_the_passages_back():
    document = SplitDocument([Passage(0, 10, 0, 7, "第一条"), Passage(8, 20, 5, 14, "第一条 （一）")], total_tokens=14)
    wire = response_of("r9", document).SerializeToString()
    assert document_of(k25_pb2.ChunkResponse.FromString(wire)) == document


def test_an_error_response_raises_its_code_on_the_client_side():
    wire = error_response("r9", ChunkerError("INVALID_ARGUMENT", "too big")).SerializeToString()
    response = k25_pb2.ChunkResponse.FromString(wire)
    assert response.request_id == response.error.request_id == "r9"
    with pytest.raises(ChunkerError) as info:
        document_of(response)
    assert (info.value.code, info.value.message) == ("INVALID_ARGUMENT", "too big")


def test_error_codes_are_the_wire_enum():
    with pytest.raises(ValueError, match="not a k25.v1.ErrorCode"):
        ChunkerError("TOO_BIG", "x")
