"""Penalties and biases on logits, checked against outside references: transformers'
RepetitionPenaltyLogitsProcessor, and OpenAI's documented formula for presence and
frequency penalties (logit - count x frequency - [count > 0] x presence)."""

import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from engine.core.sampling_params import SamplingParams
from engine.runner.penalties import apply_penalties

VOCAB = 50


def _logits(rows: int) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(0)) * 3


def test_the_repetition_penalty_matches_transformers():
    logits = _logits(2)
    prompt, answer = [3, 4, 4], [7, 3]
    expected = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([prompt + answer]), logits[:1].clone())
    apply_penalties(logits, [SamplingParams(repetition_penalty=1.3), SamplingParams()], [prompt, prompt], [answer, answer])
    torch.testing.assert_close(logits[:1], expected)


def test_presence_and_frequency_follow_openai_s_formula_on_the_answer_only():
    logits = _logits(1)
    original = logits.clone()
    apply_penalties(logits, [SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)], [[9, 9]], [[2, 2, 5]])
    expected = original.clone()
    expected[0, 2] -= 2 * 0.25 + 0.5
    expected[0, 5] -= 0.25 + 0.5
    torch.testing.assert_close(logits, expected)  # token 9 of the prompt untouched


def test_logit_bias_and_untouched_rows():
    logits = _logits(3)
    original = logits.clone()
    params = [SamplingParams(), SamplingParams(logit_bias=((1, 100.0), (2, -100.0))), SamplingParams()]
    apply_penalties(logits, params, [[1]] * 3, [[1]] * 3)
    assert torch.equal(logits[0], original[0]) and torch.equal(logits[2], original[2])
    assert logits[1].argmax() == 1 and logits[1, 2] == original[1, 2] - 100
