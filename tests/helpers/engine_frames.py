"""Frames an engine must refuse with INVALID_ARGUMENT and go on serving after."""

import random

from proto import k25_pb2
from tests.helpers.engine_process import generate_message


def invalid_requests(prompt: list[int], chunk_size: int = 32) -> list[k25_pb2.ClientMessage]:
    """Valid protobuf, invalid fields: each one the engine must refuse with INVALID_ARGUMENT."""
    def request(**sampling):
        return generate_message(prompt, chunk_size, **({"max_tokens": 4} | sampling))

    no_id = request()
    no_id.generate.request_id = ""
    out_of_vocab = request()
    out_of_vocab.generate.prompt_token_ids[0] = 10_000_000
    all_pads = request()
    all_pads.generate.pad_length = len(all_pads.generate.prompt_token_ids)
    return [
        no_id, out_of_vocab, all_pads,
        request(max_tokens=0), request(top_p=2.0), request(temperature=-1.0), request(logprobs=50),
        request(stop=[""]), request(top_k=-3), request(max_tokens=100_000),
    ]


def malformed_frames(prompt: list[int], count: int, chunk_size: int = 32) -> list[list[bytes]]:
    rng = random.Random(0)
    kinds_of_bad = [
        lambda: [b"\x00" + rng.randbytes(rng.randrange(0, 64))],  # garbage (field number 0 never parses)
        lambda: [b"first", b"second"],  # two frames
        lambda: [b"", generate_message(prompt, chunk_size, max_tokens=1).SerializeToString()],  # a REQ-style delimiter
        lambda: [b""],  # an empty ClientMessage
        lambda: [rng.choice(invalid_requests(prompt, chunk_size)).SerializeToString()],
    ]
    return [kinds_of_bad[i % len(kinds_of_bad)]() for i in range(count)]
