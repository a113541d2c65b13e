"""The engine's prefix cache: greedy outputs are the same token for token with the cache on
and off (fp32), with batches that mix adapters and the base model and with preemptions;
what a request found cached is reported in its usage and never crosses adapters or salts."""

import pytest

from common.tokenizer import load_tokenizer
from engine.base.config import EngineConfig
from engine.core.sampling_params import SamplingParams
from engine.llm_engine import LLMEngine
from engine.model.loader import load_model
from engine.offline import generate, make_request
from tests.fixtures.parity_prompts import parity_prompt_ids
from tests.helpers.lora_helpers import MIXED_SPECS, run_mixed, save_tiny_llama_with_adapters

GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)
BLOCK = 16


@pytest.fixture(scope="module")
def document_prompts():
    """Questions about two documents: each prompt is a document (the same tokens for every
    question about it) followed by one question."""
    ids = parity_prompt_ids(load_tokenizer("smollm2-135m"))
    documents = [next(p for p in ids if 300 < len(p) < 600)[:200], [t for p in ids[:6] for t in p][:150]]
    questions = [p[:12] for p in ids[6:9]]
    return [doc + q for doc in documents for q in questions]


@pytest.fixture(scope="module")
def tiny_with_adapters(tmp_path_factory, tiny_model):
    folder, root = tmp_path_factory.mktemp("tiny-llama"), tmp_path_factory.mktemp("adapters")
    save_tiny_llama_with_adapters(folder, root, tiny_model.tokenizer)
    return load_model(str(folder)), root


def make_engine(model, root, prefix_caching: bool, max_chunks: int = 32) -> LLMEngine:
    engine = LLMEngine(model, EngineConfig(
        chunk_size=64, max_chunk_per_gpu=max_chunks, max_num_batched_tokens=64, block_size=BLOCK, max_loras=3,
        max_cpu_loras=3, max_lora_rank=16, adapter_root=str(root), dtype="float32", prefix_caching=prefix_caching,
    ))
    for name in MIXED_SPECS:
        engine.load_adapter(name, "v1", name)
    return engine


def jobs_for(prompts):
    return [(p, name) for p in prompts for name in (None, *MIXED_SPECS)]


# (label, KV chunks of 64 tokens): room for everything, and so little room that requests are
# preempted and cached blocks evicted
MODES = [pytest.param(32, id="roomy"), pytest.param(6, id="preemptions")]


@pytest.mark.parametrize("max_chunks", MODES)
def test_outputs_equal_with_and_without_cache_across_adapters_and_preemptions(tiny_with_adapters, document_prompts, max_chunks):
    model, root = tiny_with_adapters
    jobs = jobs_for(document_prompts)
    uncached = run_mixed(make_engine(model, root, False, max_chunks), jobs, GREEDY)
    engine = make_engine(model, root, True, max_chunks)
    first = run_mixed(engine, jobs, GREEDY)  # one batch: later questions may reuse what earlier ones computed
    again = run_mixed(engine, jobs, GREEDY)  # the same questions asked again
    for label, outputs in (("first pass", first), ("second pass", again)):
        for (prompt, name), out, ref in zip(jobs, outputs, uncached):
            assert out.finish_reason.value == "length", out.last.error
            assert out.token_ids == ref.token_ids, f"{label}: adapter {name}: cached output differs"
    assert all(o.last.usage.cached_tokens == 0 for o in uncached)
    cached = [o.last.usage.cached_tokens for o in again]
    if max_chunks == 32:
        # the cache kept everything: all full blocks of each prompt but its last token come back
        assert cached == [(len(p) - 1) // BLOCK * BLOCK for p, _ in jobs]
        assert engine.block_manager.stats.evicted_blocks == 0
    else:
        assert engine.num_preemptions > 0 and engine.block_manager.stats.evicted_blocks > 0
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and bm.usage == 0.0, "cached blocks count as free once no one uses them"
    assert bm.stats.hit_tokens >= sum(cached)


def test_no_reuse_across_adapters_or_salts(tiny_with_adapters, document_prompts):
    model, root = tiny_with_adapters
    engine = make_engine(model, root, True)
    prompt = document_prompts[0]
    run_mixed(engine, [(prompt, None)], GREEDY)
    # the same tokens under each adapter, then with a salt: nothing cached for them
    for out in run_mixed(engine, [(prompt, name) for name in MIXED_SPECS], GREEDY):
        assert out.last.usage.cached_tokens == 0
    unsalted = generate(engine, [prompt], GREEDY)  # no salt: the base model's blocks are found
    assert unsalted[0].last.usage.cached_tokens == (len(prompt) - 1) // BLOCK * BLOCK
    salted = make_request(engine, prompt, GREEDY)
    salted.cache_salt = "tenant-b"
    engine.add_request(salted)
    finals = []
    while engine.has_unfinished():
        finals += [out for out in engine.step().outputs if out.finished]
    assert [out.usage.cached_tokens for out in finals] == [0]


def test_cache_off_finds_nothing(tiny_with_adapters, document_prompts):
    model, root = tiny_with_adapters
    engine = make_engine(model, root, False)
    generate(engine, document_prompts[:1], GREEDY)
    out = generate(engine, document_prompts[:1], GREEDY)
    assert out[0].last.usage.cached_tokens == 0 and engine.block_manager.num_cached_blocks == 0


def test_smollm2_second_question_reuses_the_document(smollm2, document_prompts):
    """The real model in fp32: a repeated document is not computed again, outputs unchanged."""
    config = EngineConfig(chunk_size=64, max_chunk_per_gpu=16, max_num_batched_tokens=256, dtype="float32")
    reference = generate(LLMEngine(smollm2, EngineConfig(**{**config.__dict__, "prefix_caching": False})), document_prompts, GREEDY)
    engine = LLMEngine(smollm2, config)
    outputs = [generate(engine, [p], GREEDY)[0] for p in document_prompts]  # one at a time: each finds the ones before
    assert [o.token_ids for o in outputs] == [r.token_ids for r in reference]
    # the first question about each document computes it; the next two find it cached
    document_blocks = [200 // BLOCK, 150 // BLOCK]
    expected = [0 if i % 3 == 0 else document_blocks[i // 3] * BLOCK for i in range(6)]
    assert [o.last.usage.cached_tokens for o in outputs] == expected
