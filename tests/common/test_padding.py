"""pad_to_chunk_size and the engine's promise that pads cost nothing and change nothing."""

import pytest

from common.padding import pad_to_chunk_size
from engine.base.config import EngineConfig
from engine.core.sampling_params import SamplingParams
from engine.llm_engine import LLMEngine
from engine.offline import generate, make_request


@pytest.mark.parametrize("length, chunk, pads", [(1, 64, 63), (64, 64, 0), (65, 64, 63), (300, 256, 212)])
def test_pads_to_the_next_multiple(length, chunk, pads):
    padded, pad_length = pad_to_chunk_size(list(range(length)), chunk, pad_token_id=2)
    assert pad_length == pads and len(padded) % chunk == 0
    assert padded[:length] == list(range(length)) and padded[length:] == [2] * pads


@pytest.mark.parametrize("ids, chunk", [([], 64), ([1], 0)])
def test_refuses_what_cannot_be_padded(ids, chunk):
    with pytest.raises(ValueError):
        pad_to_chunk_size(ids, chunk, pad_token_id=2)


def test_pads_are_never_computed(tiny_model):
    engine = LLMEngine(tiny_model, EngineConfig(chunk_size=256, max_chunk_per_gpu=2, max_num_batched_tokens=512))
    request = make_request(engine, [1000 + i for i in range(5)], SamplingParams(max_tokens=3, ignore_eos=True))
    assert len(request.prompt_token_ids) == 256 and request.pad_length == 251
    engine.add_request(request)
    batch = engine.scheduler.schedule()
    assert [(seq.request_id, n) for seq, n in batch.items] == [(request.request_id, 5)]
    assert engine.block_manager.num_blocks - engine.block_manager.num_free_blocks == 1  # 5 tokens: one block


def test_outputs_do_not_depend_on_the_pad_length(tiny_model):
    prompts = [[1000 + i for i in range(n)] for n in (3, 31, 32, 33, 100)]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    by_chunk = {
        chunk: [c.token_ids for c in generate(LLMEngine(tiny_model, EngineConfig(chunk_size=chunk, max_chunk_per_gpu=16)), prompts, params)]
        for chunk in (16, 32, 256)
    }
    assert by_chunk[16] == by_chunk[32] == by_chunk[256]
