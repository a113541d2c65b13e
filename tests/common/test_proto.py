import pathlib

import pytest

from proto import k25_pb2
from proto.generate import PROTO_DIR, PROTO_FILES, generate_to


def test_generated_code_is_fresh(tmp_path: pathlib.Path):
    generate_to(tmp_path)
    for name in PROTO_FILES:
        module = name.replace(".proto", "_pb2.py")
        fresh = (tmp_path / module).read_text()
        committed = (PROTO_DIR / module).read_text()
        assert committed == fresh, f"proto/{module} is stale: run `make proto` and commit it"


def test_request_round_trips_with_every_contract_field():
    request = k25_pb2.GenerateRequest(
        request_id="r1",
        tenant="acme",
        model="smollm2-135m",
        adapter=k25_pb2.Adapter(name="contracts", version="v2"),
        prompt_token_ids=[1, 2, 3, 0],
        pad_length=1,
        chunk_size=4,
        sampling=k25_pb2.SamplingParams(temperature=0.7, top_p=0.9, top_k=40, seed=7, max_tokens=16, stop=["\n\n"]),
        deadline_unix_s=1.5e9,
        trace=k25_pb2.TraceContext(traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01", tracestate="k=v"),
    )
    wire = k25_pb2.ClientMessage(generate=request).SerializeToString()
    decoded = k25_pb2.ClientMessage.FromString(wire)
    assert decoded.WhichOneof("kind") == "generate"
    assert decoded.generate == request
    assert decoded.generate.sampling.HasField("seed")


def test_error_codes_are_the_design_enum():
    names = {v.name for v in k25_pb2.ErrorCode.DESCRIPTOR.values} - {"ERROR_CODE_UNSPECIFIED"}
    assert names == {
        "INVALID_ARGUMENT", "CHUNK_SIZE_MISMATCH", "RESOURCE_EXHAUSTED", "ADAPTER_NOT_FOUND",
        "DEADLINE_EXCEEDED", "CANCELLED", "INTERNAL",
    }


def test_garbage_bytes_raise_decode_error_not_crash():
    from google.protobuf.message import DecodeError

    with pytest.raises(DecodeError):
        k25_pb2.ClientMessage.FromString(b"\xff\xff\xff\xff garbage")
