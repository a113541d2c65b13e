"""The reference the chunker is measured against: fixed windows of chunk_size tokens."""

from services.chunker.boundaries import Chunk, ChunkParams


def fixed_windows(offsets: list[tuple[int, int]], text_length: int, params: ChunkParams) -> list[Chunk]:
    """Windows of chunk_size tokens, each starting overlap_tokens before the previous one ends."""
    n = len(offsets)
    step = params.chunk_size - params.overlap_tokens

    def char_at(token: int) -> int:
        return 0 if token == 0 else text_length if token >= n else offsets[token][0]

    chunks = []
    for start in range(0, n, step):
        end = min(start + params.chunk_size, n)
        chunks.append(Chunk(char_at(start), char_at(end), start, end, ""))
        if end == n:
            break
    return chunks
