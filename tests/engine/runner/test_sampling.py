"""Sampling and streaming: seeds, top-k/top-p, stop strings and ids, logprobs, deltas."""

import math

import pytest
import torch

from engine.base.config import EngineConfig
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import FinishReason
from engine.llm_engine import LLMEngine
from engine.offline import generate, stream
from engine.runner.sampler import _draw, filtered_probabilities, make_generator


@pytest.fixture(scope="module")
def engine(tiny_model):
    return LLMEngine(tiny_model, EngineConfig(chunk_size=32, max_chunk_per_gpu=16, max_num_batched_tokens=64))


PROMPT = [1200, 1300, 1400, 1500, 1600]
OTHERS = [[2000 + i for i in range(n)] for n in (3, 40, 9)]


def test_seeded_sampling_is_reproducible_whatever_it_is_batched_with(engine):
    params = SamplingParams(max_tokens=20, temperature=1.0, seed=42, ignore_eos=True)
    alone = generate(engine, [PROMPT], params)[0].token_ids
    noise = SamplingParams(max_tokens=20, temperature=1.0, ignore_eos=True)
    batched = generate(engine, [OTHERS[0], PROMPT, *OTHERS[1:]], [noise, params, noise, noise])[1].token_ids
    assert alone == batched
    other_seed = generate(engine, [PROMPT], SamplingParams(max_tokens=20, temperature=1.0, seed=43, ignore_eos=True))
    assert other_seed[0].token_ids != alone


def test_top_k_one_and_tiny_top_p_are_greedy(engine):
    greedy = generate(engine, [PROMPT], SamplingParams(max_tokens=12, ignore_eos=True))[0].token_ids
    top_k = generate(engine, [PROMPT], SamplingParams(max_tokens=12, temperature=2.0, top_k=1, seed=1, ignore_eos=True))
    top_p = generate(engine, [PROMPT], SamplingParams(max_tokens=12, temperature=2.0, top_p=1e-6, seed=1, ignore_eos=True))
    assert top_k[0].token_ids == greedy and top_p[0].token_ids == greedy


def _filtered(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """filtered_probabilities for one row, put back in vocabulary order."""
    probs, order = filtered_probabilities(logits.unsqueeze(0), [params])
    return torch.zeros_like(probs).scatter(1, order, probs)[0]


def test_filters_keep_exactly_the_allowed_tokens():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    top_p = _filtered(logits, SamplingParams(temperature=1.0, top_p=0.6))
    assert torch.allclose(top_p, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    top_k = _filtered(logits, SamplingParams(temperature=1.0, top_k=3))
    assert torch.allclose(top_k, torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95)
    hot = _filtered(logits, SamplingParams(temperature=2.0))
    expected = torch.tensor([0.5, 0.3, 0.15, 0.05]).sqrt()
    assert torch.allclose(hot, expected / expected.sum())


def test_each_row_of_a_batch_is_filtered_by_its_own_params():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]]))
    params = [SamplingParams(temperature=1.0, top_p=0.6), SamplingParams(temperature=2.0, top_k=2), SamplingParams(temperature=0.5)]
    probs, order = filtered_probabilities(logits, params)
    in_vocab_order = torch.zeros_like(probs).scatter(1, order, probs)
    for row, p in enumerate(params):
        assert torch.allclose(in_vocab_order[row], _filtered(logits[row], p))


def test_the_draw_follows_the_probabilities():
    """20,000 seeded draws (deterministic, so never flaky) land on each token within five
    standard deviations of its probability, and never on a token of probability 0."""
    probs = torch.tensor([0.5, 0.3, 0.2, 0.0])
    draws = 20_000
    generators = [make_generator(7)] * draws
    picked = _draw(probs.expand(draws, 4).contiguous(), generators)
    counts = torch.bincount(picked, minlength=4).float()
    sigma = (draws * probs * (1 - probs)).sqrt()
    assert counts[3] == 0
    assert ((counts - draws * probs).abs() <= 5 * sigma + 1).all(), counts


def test_stop_string_ends_the_text_before_it_and_never_streams_it(engine, tiny_model):
    full = generate(engine, [PROMPT], SamplingParams(max_tokens=24, ignore_eos=True))[0]
    text = full.text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert len(stop) == 3 and stop.strip(), text
    deltas = list(stream(engine, PROMPT, SamplingParams(max_tokens=24, ignore_eos=True, stop=(stop,))))
    streamed = "".join(d.text for d in deltas)
    assert deltas[-1].finish_reason is FinishReason.STOP
    assert streamed == text[: text.index(stop)]
    assert all(stop not in d.text for d in deltas)


def test_stop_token_id_ends_generation_at_that_token(engine):
    full = generate(engine, [PROMPT], SamplingParams(max_tokens=10, ignore_eos=True))[0].token_ids
    stop_id = full[4]
    first = full.index(stop_id)
    out = generate(engine, [PROMPT], SamplingParams(max_tokens=10, ignore_eos=True, stop_token_ids=(stop_id,)))[0]
    assert out.finish_reason is FinishReason.STOP and out.token_ids == full[: first + 1]


def test_logprobs_are_normalised_and_ranked(engine):
    out = generate(engine, [PROMPT], SamplingParams(max_tokens=6, logprobs=5, ignore_eos=True))[0]
    assert len(out.logprobs) == 6
    for token_id, entry in zip(out.token_ids, out.logprobs):
        assert entry.token_id == token_id and entry.logprob <= 0
        assert len(entry.top) == 5 and entry.top[0][0] == token_id  # greedy picks the best
        values = [lp for _, lp in entry.top]
        assert values == sorted(values, reverse=True) and sum(math.exp(v) for v in values) <= 1 + 1e-5


def test_length_finish_and_usage(engine):
    out = generate(engine, [PROMPT], SamplingParams(max_tokens=7, ignore_eos=True))[0]
    assert out.finish_reason is FinishReason.LENGTH
    assert (out.last.usage.prompt_tokens, out.last.usage.completion_tokens) == (5, 7)
    assert out.last.usage.pad_tokens == 32 - 5
