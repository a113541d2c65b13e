"""One document through the model's tokenizer, the anchor finder and the boundary choice:
the document cut into passages."""

from dataclasses import dataclass

from common.tokenizer import Tokenizer
from common.anchors import find_anchors
from services.chunker.boundaries import ChunkParams, Passage, choose_passages


@dataclass(frozen=True)
class SplitDocument:
    """A document cut into passages, in text order."""

    passages: list[Passage]
    total_tokens: int


@dataclass(frozen=True)
class TokenizedText:
    text: str
    offsets: list[tuple[int, int]]  # each token's (start, end) code point offsets


def tokenize(tokenizer: Tokenizer, text: str) -> TokenizedText:
    """The text's tokens as the model sees them (no BOS/EOS), by character offsets."""
    return TokenizedText(text, tokenizer.backend.encode(text, add_special_tokens=False).offsets)


class Chunker:
    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer

    def split(self, text: str, params: ChunkParams) -> SplitDocument:
        tokens = tokenize(self.tokenizer, text)
        passages = choose_passages(find_anchors(text), tokens.offsets, len(text), params)
        return SplitDocument(passages, len(tokens.offsets))
