"""The boundary choice: anchors and token offsets in, passage spans out. Pure; no tokenizer here.

A document is cut into passages: runs of whole tokens of at most `passage_tokens`;
consecutive passages may overlap by up to `overlap_ratio × passage_tokens` tokens. A passage
may only start or end on a token boundary that is also a character boundary (a "clean" one),
unless a stretch has none at all. (A passage is not the pool's `chunk_size` unit of padding
and KV capacity: its budget is the chunker's own parameter.)

Where a passage ends, among the anchors in reach, is decided by one ordering (best first):
  1. whole-line anchors (strength >= LINE) before anything inside a line: so a line, with
     its line break, that fits in passage_tokens is never split across passages;
  2. anchors at or above `semantic_threshold` before weaker ones, which end a passage only
     when nothing at the threshold is in reach;
  3. anchors in the later half of the new text before earlier ones, so passages stay full;
  4. stronger before weaker, then later before earlier.
With no anchor in reach at all, the passage ends at the last clean token boundary.

The next passage then starts up to the overlap before that end, at the best anchor there
(whole-line first, then stronger, then earlier), but never so early that the line that
follows the end no longer fits: the overlap gives way to a whole clause.
"""

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Sequence

from common.anchors import LINE, Anchor

MIN_PASSAGE_TOKENS = 16  # room for new text after the largest overlap, even for 4-byte characters
MAX_PASSAGE_TOKENS = 1 << 20
MAX_OVERLAP_RATIO = 0.5


@dataclass(frozen=True)
class ChunkParams:
    """The chunker's parameters: how a document is cut into passages.

    `passage_tokens` travels on the wire as ChunkRequest.chunk_size, its old name, which the
    HTTP API and the `k25 chunk`/`k25 chunker` flags still accept."""

    passage_tokens: int = 512  # a passage's token budget: most tokens in one passage
    overlap_ratio: float = 0.1  # share of passage_tokens a passage may repeat from the one before
    semantic_threshold: float = 0.5  # the weakest anchor that may end a passage by choice

    def __post_init__(self):
        if isinstance(self.passage_tokens, bool) or not isinstance(self.passage_tokens, int):
            raise ValueError(f"passage_tokens (chunk_size) must be an integer, got {self.passage_tokens!r}")
        if not MIN_PASSAGE_TOKENS <= self.passage_tokens <= MAX_PASSAGE_TOKENS:
            raise ValueError(
                f"passage_tokens (chunk_size) must be between {MIN_PASSAGE_TOKENS} and {MAX_PASSAGE_TOKENS} tokens, "
                f"got {self.passage_tokens}"
            )
        if not (math.isfinite(self.overlap_ratio) and 0 <= self.overlap_ratio <= MAX_OVERLAP_RATIO):
            raise ValueError(f"overlap_ratio must be between 0 and {MAX_OVERLAP_RATIO}, got {self.overlap_ratio}")
        if not (math.isfinite(self.semantic_threshold) and 0 <= self.semantic_threshold <= 1):
            raise ValueError(f"semantic_threshold must be between 0 and 1, got {self.semantic_threshold}")

    @property
    def overlap_tokens(self) -> int:
        return int(self.overlap_ratio * self.passage_tokens)


@dataclass(frozen=True)
class Passage:
    """One piece of a document, cut at an anchor (proto's `Chunk` message on the wire)."""

    start_char: int
    end_char: int  # exclusive
    start_token: int
    end_token: int  # exclusive
    anchor: str  # the numbering path in force where the passage opens ("" before any)

    def as_dict(self) -> dict:
        return {
            "start_char": self.start_char, "end_char": self.end_char,
            "start_token": self.start_token, "end_token": self.end_token, "anchor": self.anchor,
        }


def first_token_at(token_starts: Sequence[int], char: int) -> int:
    """The first token that holds `char` (a character may span several byte-level tokens)."""
    i = bisect_left(token_starts, char)
    if i == len(token_starts) or token_starts[i] > char:
        i -= 1  # the token that holds it started earlier
    return max(i, 0)


@dataclass(frozen=True)
class _Cut:
    token: int  # the boundary before this token
    strength: float
    path: str


class _Boundaries:
    """The token boundaries of one text: which are clean, which carry anchors, and their chars."""

    def __init__(self, anchors: Sequence[Anchor], offsets: Sequence[tuple[int, int]], text_length: int):
        self.n = len(offsets)
        self.text_length = text_length
        self.starts = [start for start, _ in offsets]
        self.clean = [0] + [k for k in range(1, self.n) if offsets[k - 1][1] <= offsets[k][0]]
        self.cuts = self._snap(anchors)
        self.cut_tokens = [cut.token for cut in self.cuts]
        self.line_tokens = [cut.token for cut in self.cuts if cut.strength >= LINE]

    def _snap(self, anchors: Sequence[Anchor]) -> list[_Cut]:
        """Each anchor moved back to the clean boundary before the token that holds its first char."""
        by_token: dict[int, _Cut] = {}
        for anchor in anchors:
            if anchor.char >= self.text_length:
                continue
            holder = first_token_at(self.starts, anchor.char)
            token = self.clean[bisect_right(self.clean, holder) - 1]
            known = by_token.get(token)
            strength = anchor.strength if known is None else max(known.strength, anchor.strength)
            by_token[token] = _Cut(token, strength, anchor.path)  # paths only grow along the text
        return [by_token[k] for k in sorted(by_token)]

    def char_at(self, token: int) -> int:
        if token == 0:
            return 0
        return self.text_length if token >= self.n else self.starts[token]

    def cuts_in(self, low: int, high: int) -> list[_Cut]:
        """Anchored boundaries with low <= token <= high."""
        return self.cuts[bisect_left(self.cut_tokens, low) : bisect_right(self.cut_tokens, high)]

    def path_at(self, token: int) -> str:
        i = bisect_right(self.cut_tokens, token) - 1
        return self.cuts[i].path if i >= 0 else ""

    def next_whole_line(self, token: int) -> int:
        """The first whole-line anchor after `token`, or the end of the text."""
        i = bisect_right(self.line_tokens, token)
        return self.line_tokens[i] if i < len(self.line_tokens) else self.n

    def last_clean(self, low: int, high: int) -> int:
        """The last clean boundary in (low, high], or high itself when there is none."""
        i = bisect_right(self.clean, high) - 1
        return self.clean[i] if self.clean[i] > low else high

    def first_clean(self, low: int, high: int) -> int | None:
        """The first clean boundary in [low, high), if any."""
        i = bisect_left(self.clean, low)
        return self.clean[i] if i < len(self.clean) and self.clean[i] < high else None


def choose_passages(
    anchors: Sequence[Anchor], offsets: Sequence[tuple[int, int]], text_length: int, params: ChunkParams
) -> list[Passage]:
    """Passages covering the text whose tokens have these (start, end) char offsets."""
    b = _Boundaries(anchors, offsets, text_length)
    if b.n == 0:
        return []
    passages = []
    start, previous_start, previous_end = 0, -1, 0
    while True:
        end = _choose_end(b, start, previous_end, params)
        passages.append(Passage(b.char_at(start), b.char_at(end), start, end, b.path_at(start)))
        if end == b.n:
            return passages
        start, previous_start, previous_end = _choose_start(b, previous_start=start, end=end, params=params), start, end


def _choose_end(b: _Boundaries, start: int, previous_end: int, params: ChunkParams) -> int:
    limit = start + params.passage_tokens
    if limit >= b.n:
        return b.n
    late = previous_end + (limit - previous_end) // 2

    def rank(cut: _Cut):
        return (
            cut.strength >= LINE,
            cut.strength >= params.semantic_threshold,
            cut.token >= late,
            cut.strength,
            cut.token,
        )

    candidates = b.cuts_in(previous_end + 1, limit)
    if candidates:
        return max(candidates, key=rank).token
    return b.last_clean(previous_end, limit)


def _choose_start(b: _Boundaries, previous_start: int, end: int, params: ChunkParams) -> int:
    low = max(end - params.overlap_tokens, previous_start + 1)
    following_line = b.next_whole_line(end) - end
    if following_line <= params.passage_tokens:
        low = max(low, end + following_line - params.passage_tokens)
    if low >= end:
        return end
    candidates = b.cuts_in(low, end - 1)
    if candidates:
        return max(candidates, key=lambda cut: (cut.strength >= LINE, cut.strength, -cut.token)).token
    clean = b.first_clean(low, end)
    return end if clean is None else clean
