"""Applying a step's token bitmask to the logits, against the plain reading of llguidance's
layout (bit t % 32 of word t // 32 allows token t): whole words of blocked tokens, words mixing
allowed and blocked ones, free rows, and vocabularies that are not a multiple of 32."""

import numpy as np
import pytest
import torch

from engine.structured.token_masks import apply_token_bitmask


def _reference(logits: torch.Tensor, words: np.ndarray) -> torch.Tensor:
    bits = np.unpackbits(words.view(np.uint8), bitorder="little").reshape(words.shape[0], -1)
    return logits.masked_fill(torch.from_numpy(bits[:, : logits.shape[1]] == 0), float("-inf"))


@pytest.mark.parametrize("vocab", [64, 49152, 100, 31])
def test_the_mask_blocks_exactly_the_tokens_whose_bit_is_clear(vocab):
    rng = np.random.default_rng(vocab)
    rows, count = 6, (vocab + 31) // 32
    kinds = rng.choice(3, size=(rows, count), p=[0.6, 0.2, 0.2])
    random_words = rng.integers(-2**31, 2**31, size=(rows, count), dtype=np.int64).astype(np.int32)
    words = np.where(kinds == 0, 0, np.where(kinds == 1, -1, random_words)).astype(np.int32)
    words[0] = -1  # a free row
    words[1, 0] = 1  # one token allowed in a word, the first
    logits = torch.randn(rows, vocab)
    expected = _reference(logits, words)
    apply_token_bitmask(logits, torch.from_numpy(words))
    assert torch.equal(logits, expected)
