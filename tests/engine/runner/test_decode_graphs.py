"""Decode graphs (engine/runner/decode_graphs.py): which bucket a step runs, and the padding a graph's
static batch relies on, on the CPU against the eager forward of the same step with the real
model: padding rows change no sequence's logits and write only the scratch block. Capture and
replay themselves need CUDA: those tests run where it is."""

import numpy as np
import pytest
import torch

from engine.attention.kv_cache import KVCache
from engine.base.config import EngineConfig
from engine.base.errors import EngineConfigError
from engine.core.sampling_params import SamplingParams
from engine.llm_engine import LLMEngine
from engine.lora.adapter import BASE_SLOT
from engine.offline import make_request
from engine.runner.decode_graphs import DecodeGraphs, StaticDecodeBatch, bucket_for, capture_sizes
from engine.runner.forward_batch import HostBatch, host_batch, to_device


@pytest.mark.parametrize("max_num_seqs, sizes", [
    (1, [1]), (3, [1, 2, 3]), (12, [1, 2, 4, 8, 12]), (32, [1, 2, 4, 8, 16, 24, 32]),
    (128, [1, 2, 4] + list(range(8, 129, 8))),
])
def test_buckets_are_powers_of_two_then_multiples_of_8_up_to_max_num_seqs(max_num_seqs, sizes):
    assert capture_sizes(max_num_seqs) == sizes


@pytest.mark.parametrize("decodes, bucket", [(1, 1), (3, 4), (4, 4), (5, 8), (9, 16), (128, 128), (129, None)])
def test_a_step_runs_the_smallest_bucket_that_holds_it(decodes, bucket):
    assert bucket_for(decodes, capture_sizes(128)) == bucket


def engine_in_decode(model, prompts, device="cpu") -> LLMEngine:
    """An engine whose sequences have all finished their prompts: its next step is all decodes."""
    engine = LLMEngine(model, EngineConfig(device=device, chunk_size=64, max_chunk_per_gpu=4, max_num_seqs=8))
    for prompt in prompts:
        engine.add_request(make_request(engine, prompt, SamplingParams(max_tokens=20, ignore_eos=True)))
    while any(seq.num_computed_tokens < len(seq.prompt_token_ids) for seq in engine.scheduler.running) or engine.num_waiting:
        engine.step()
    return engine


def decode_step(engine: LLMEngine):
    return host_batch([(seq, 1) for seq in engine.scheduler.running], engine.runner.block_tables, engine.config.block_size)


@pytest.mark.parametrize("bucket", [3, 8])
def test_padding_rows_change_no_sequences_logits_and_write_only_the_scratch_block(tiny_model, bucket):
    engine = engine_in_decode(tiny_model, [list(range(5, 5 + n)) for n in (3, 40, 17)])
    host = decode_step(engine)
    assert host.decodes_only and len(host.input_ids) == 3
    kv, block_size = engine.runner.kv, engine.config.block_size
    scratch = engine.block_manager.num_blocks
    # the cache as a graphing engine has it: one block more, the scratch block, after the managed ones
    padded_kv = KVCache(engine.runner.model.config, kv.k[0].shape[1] + block_size, "cpu", torch.float32)
    for ours, theirs in zip(padded_kv.k + padded_kv.v, kv.k + kv.v):
        ours[:, : theirs.shape[1]] = theirs
    with torch.inference_mode():
        eager = engine.runner.model.forward(to_device(host, block_size, "cpu"), kv)
        static = StaticDecodeBatch(8, engine.runner.block_tables.table.shape[1], scratch, block_size, "cpu")
        padded = engine.runner.model.forward(static.fill(host, bucket), padded_kv)
    assert padded.shape[0] == bucket
    # the same arithmetic but for the row count of each projection's matmul (float32 sums
    # their products in another order: 4e-7 of the logits' scale measured here); a padding
    # row that leaked into a sequence's attention would move its logits by their own scale
    scale = eager.abs().max()
    torch.testing.assert_close(padded[:3], eager, rtol=0, atol=1e-5 * scale)
    new_slots = torch.from_numpy(host.slot_mapping)
    scratch_slots = torch.arange(scratch * block_size, (scratch + 1) * block_size)
    untouched = torch.ones(kv.k[0].shape[1], dtype=torch.bool)  # the managed slots (the scratch block is past them)
    untouched[new_slots] = False
    for ours, theirs in zip(padded_kv.k + padded_kv.v, kv.k + kv.v):
        assert torch.equal(ours[:, : theirs.shape[1]][:, untouched], theirs[:, untouched])
        torch.testing.assert_close(ours[:, new_slots], theirs[:, new_slots], rtol=0, atol=1e-5 * theirs.abs().max())
        assert bool(ours[:, scratch_slots].abs().sum() > 0) == (bucket > 3)  # only padding rows write there


def host(rows_per_seq, sampled, lora_slot=BASE_SLOT):
    tokens = sum(rows_per_seq)
    return HostBatch(
        input_ids=np.zeros(tokens, np.int64), positions=np.zeros(tokens, np.int64), slot_mapping=np.zeros(tokens, np.int64),
        query_start=np.cumsum([0] + rows_per_seq).astype(np.int32), seq_lens=np.array(rows_per_seq, np.int32),
        block_tables=np.zeros((len(rows_per_seq), 1), np.int32), logits_rows=np.zeros(sampled, np.int64),
        sampled=[None] * sampled, lora_slots=np.full(tokens, lora_slot),
    )


def test_only_steps_of_one_sampled_token_a_sequence_are_decode_steps():
    assert host([1, 1, 1], sampled=3).decodes_only
    assert not host([1, 10], sampled=2).decodes_only  # a prefill slice
    assert not host([1, 1], sampled=1).decodes_only  # a one-token prompt slice, not yet sampled
    assert not host([1], sampled=1).uses_lora
    assert host([1], sampled=1, lora_slot=0).uses_lora


@pytest.mark.skipif(torch.cuda.is_available(), reason="the failure to capture where CUDA is not")
def test_a_capture_that_fails_says_how_to_start_without_graphs(tiny_model):
    engine = engine_in_decode(tiny_model, [[5, 6, 7]])
    static = StaticDecodeBatch(2, 4, engine.block_manager.num_blocks, engine.config.block_size, "cpu")
    with pytest.raises(EngineConfigError, match="--no-cuda-graphs"):
        DecodeGraphs(engine.runner.model, engine.runner.kv, static, [1, 2])


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


@cuda
@pytest.mark.parametrize("prompts", [1, 3, 8])
def test_replayed_graphs_give_the_eager_engines_tokens(tiny_model, prompts):
    """Greedy decoding with graphs equals greedy decoding without, token for token."""
    outputs = {}
    for graphs in (True, False):
        engine = LLMEngine(tiny_model, EngineConfig(device="cuda", chunk_size=64, max_chunk_per_gpu=4, max_num_seqs=8,
                                                    cuda_graphs=graphs))
        assert (engine.runner.decode_graphs is not None) == graphs
        for i in range(prompts):
            engine.add_request(make_request(engine, list(range(5, 5 + 7 * i + 3)), SamplingParams(max_tokens=12, ignore_eos=True),
                                            request_id=f"r{i}"))
        tokens: dict[str, list[int]] = {}
        while engine.has_unfinished():
            for out in engine.step().outputs:
                tokens.setdefault(out.request_id, []).extend(out.token_ids)
        outputs[graphs] = tokens
    assert outputs[True] == outputs[False]
