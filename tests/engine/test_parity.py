"""Greedy token-for-token parity with Hugging Face transformers (see tests/parity.py for the
near-tie rule): SmolLM2 from its GGUF and a tiny random Llama saved as a Hugging Face folder,
one request at a time, in one continuous batch with staggered arrivals, padded to 64 and 256."""

import pytest
import torch

from engine.base.config import EngineConfig
from engine.base.errors import EngineError, ErrorCode
from engine.core.sampling_params import SamplingParams
from engine.llm_engine import LLMEngine
from engine.model.loader import load_model
from engine.offline import Completion, collect, generate, make_request, stream
from tests.helpers.parity import REFERENCE_NEW_TOKENS, compare, greedy_reference, save_random_llama

NEW_TOKENS = REFERENCE_NEW_TOKENS
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)

# (name, chunk_size, max_chunk_per_gpu, staggered batch?)
MODES = [
    ("one-at-a-time, chunk 64", 64, 40, False),
    ("continuous batch, chunk 64", 64, 40, True),
    ("continuous batch, chunk 256", 256, 12, True),
]


def run_one_at_a_time(engine: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    results = []
    for prompt in prompts:
        request = make_request(engine, prompt, GREEDY)
        completions = {request.request_id: Completion(request.request_id)}
        engine.add_request(request)
        while completions[request.request_id].finish_reason is None:
            collect(completions, engine.step().outputs)
        results.append(completions[request.request_id].token_ids)
    return results


def run_staggered(engine: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    """Request i arrives at step 3*i, so prefills, chunks and decodes of others interleave;
    one refused for a full KV cache is offered again at the next step, as the gateway would."""
    requests = [make_request(engine, p, GREEDY) for p in prompts]
    completions = {r.request_id: Completion(r.request_id) for r in requests}
    pending = []
    step = 0
    while any(c.finish_reason is None for c in completions.values()):
        pending += [r for i, r in enumerate(requests) if 3 * i == step]
        while pending:
            try:
                engine.add_request(pending[0])
            except EngineError as error:
                assert error.code is ErrorCode.RESOURCE_EXHAUSTED
                break
            pending.pop(0)
        collect(completions, engine.step().outputs)
        step += 1
    return [completions[r.request_id].token_ids for r in requests]


def check_parity(model, prompts, references, chunk_size, max_chunks, staggered, label, parity_report):
    engine = LLMEngine(model, EngineConfig(chunk_size=chunk_size, max_chunk_per_gpu=max_chunks, max_num_batched_tokens=256))
    outputs = run_staggered(engine, prompts) if staggered else run_one_at_a_time(engine, prompts)
    comparisons = [compare(tokens, ref) for tokens, ref in zip(outputs, references)]
    near_ties = sum(c.near_tie for c in comparisons)
    parity_report.append(
        f"{label}: {len(prompts)} prompts ({min(map(len, prompts))}-{max(map(len, prompts))} tokens), "
        f"{sum(c.matched for c in comparisons)} tokens equal, {near_ties} stopped at a near-tie, "
        f"{engine.num_preemptions} preemptions"
    )
    assert near_ties <= max(1, len(prompts) // 4), "near-ties should be rare"
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    return engine


@pytest.mark.slow
@pytest.mark.parametrize("label, chunk_size, max_chunks, staggered", MODES, ids=[m[0] for m in MODES])
def test_smollm2_matches_transformers(smollm2, smollm2_prompts, smollm2_references, label, chunk_size, max_chunks, staggered, parity_report):
    engine = check_parity(smollm2, smollm2_prompts, smollm2_references, chunk_size, max_chunks, staggered, f"SmolLM2 {label}", parity_report)
    if staggered and chunk_size == 64:
        assert engine.num_preemptions > 0, "this mode is sized so that preempted requests must recompute"


@pytest.fixture(scope="module")
def tiny_hf_folder(tmp_path_factory, tiny_model):
    return save_random_llama(tmp_path_factory.mktemp("tiny-llama"), tiny_model.tokenizer)


@pytest.fixture(scope="module")
def tiny_references(tiny_hf_folder, smollm2_prompts):
    from transformers import LlamaForCausalLM

    reference_model = LlamaForCausalLM.from_pretrained(tiny_hf_folder, dtype=torch.float32).eval()
    return [greedy_reference(reference_model, p, NEW_TOKENS) for p in smollm2_prompts]


@pytest.mark.slow
@pytest.mark.parametrize("label, chunk_size, max_chunks, staggered", MODES, ids=[m[0] for m in MODES])
def test_tiny_hf_folder_matches_transformers(tiny_hf_folder, smollm2_prompts, tiny_references, label, chunk_size, max_chunks, staggered, parity_report):
    model = load_model(str(tiny_hf_folder))
    assert not model.config.tie_word_embeddings and "lm_head.weight" in model.weights
    check_parity(model, smollm2_prompts, tiny_references, chunk_size, max_chunks, staggered, f"tiny HF folder {label}", parity_report)


@pytest.mark.slow
def test_smollm2_logprobs_match_transformers(smollm2, smollm2_prompts, smollm2_references):
    engine = LLMEngine(smollm2, EngineConfig(chunk_size=64, max_chunk_per_gpu=40))
    prompt, reference = smollm2_prompts[6], smollm2_references[6]
    [out] = generate(engine, [prompt], SamplingParams(max_tokens=8, logprobs=3, ignore_eos=True))
    assert out.token_ids == reference.token_ids[:8]
    for entry, ref in zip(out.logprobs, reference.logprobs):
        assert entry.logprob == pytest.approx(float(ref[entry.token_id]), abs=1e-4)
        top = ref.topk(3)
        assert [t for t, _ in entry.top] == top.indices.tolist()


@pytest.mark.slow
def test_smollm2_streams_chinese_without_broken_characters(smollm2):
    engine = LLMEngine(smollm2, EngineConfig(chunk_size=64, max_chunk_per_gpu=8))
    tokenizer = smollm2.tokenizer
    deltas = list(stream(engine, tokenizer.encode("春天来了，"), SamplingParams(max_tokens=40)))
    tokens = [t for d in deltas for t in d.token_ids if t not in tokenizer.eos_token_ids]
    assert "".join(d.text for d in deltas) == tokenizer.decode(tokens)
    # only a stream cut by max_tokens inside a character may end with the replacement character
    assert all("\ufffd" not in d.text for d in deltas[:-1])
    assert sum("\u4e00" <= ch <= "\u9fff" for d in deltas for ch in d.text) >= 5, "expected Chinese output"


@pytest.mark.parametrize(
    "overrides",
    [
        {"attention_bias": True},  # q/k/v/o biases, as Qwen2-style checkpoints carry
        {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
        {"rope_scaling": {"rope_type": "linear", "factor": 4.0}},
    ],
    ids=["attention-bias", "llama3-rope-scaling", "linear-rope-scaling"],
)
def test_checkpoint_variants_match_transformers(tmp_path, tiny_model, smollm2_prompts, overrides):
    from transformers import LlamaForCausalLM

    folder = save_random_llama(tmp_path, tiny_model.tokenizer, **overrides)
    prompts = [p for p in smollm2_prompts if len(p) < 600][:6]
    reference_model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    references = [greedy_reference(reference_model, p, 12) for p in prompts]
    engine = LLMEngine(load_model(str(folder)), EngineConfig(chunk_size=64, max_chunk_per_gpu=16, max_num_batched_tokens=128))
    outputs = generate(engine, prompts, SamplingParams(max_tokens=12, ignore_eos=True))
    for out, ref in zip(outputs, references):
        compare(out.token_ids, ref)
