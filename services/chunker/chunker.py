"""One document through the model's tokenizer, the anchor finder and the boundary choice."""

from dataclasses import dataclass

from common.tokenizer import Tokenizer
from services.chunker.anchors import find_anchors
from services.chunker.boundaries import Chunk, ChunkParams, choose_chunks


@dataclass(frozen=True)
class ChunkedDocument:
    chunks: list[Chunk]
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

    def chunk(self, text: str, params: ChunkParams) -> ChunkedDocument:
        tokens = tokenize(self.tokenizer, text)
        chunks = choose_chunks(find_anchors(text), tokens.offsets, len(text), params)
        return ChunkedDocument(chunks, len(tokens.offsets))
