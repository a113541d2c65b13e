"""The reference the chunker is measured against: fixed windows of passage_tokens tokens."""

from services.chunker.boundaries import ChunkParams, Passage


def fixed_windows(offsets: list[tuple[int, int]], text_length: int, params: ChunkParams) -> list[Passage]:
    """Windows of passage_tokens tokens, each starting overlap_tokens before the previous one ends."""
    n = len(offsets)
    step = params.passage_tokens - params.overlap_tokens

    def char_at(token: int) -> int:
        return 0 if token == 0 else text_length if token >= n else offsets[token][0]

    windows = []
    for start in range(0, n, step):
        end = min(start + params.passage_tokens, n)
        windows.append(Passage(char_at(start), char_at(end), start, end, ""))
        if end == n:
            break
    return windows
