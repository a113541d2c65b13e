"""What counts as a clause when the split rate is measured: a non-empty line of the document.

Deliberately simpler than the anchor finder: contracts and filings written one clause or
paragraph per line (as our fixtures are) make every line a clause, numbered or not."""

from bisect import bisect_left
from dataclasses import dataclass

from services.chunker.boundaries import Passage, first_token_at


@dataclass(frozen=True)
class Clause:
    start_char: int  # the line's first non-blank character
    end_char: int  # after its last non-blank character
    unit_end_char: int  # where the next clause starts (its line breaks included), or the text's end


def clauses(text: str) -> list[Clause]:
    spans, position = [], 0
    for line in text.split("\n"):
        if line.strip():
            start = position + len(line) - len(line.lstrip())
            spans.append((start, position + len(line.rstrip())))
        position += len(line) + 1
    next_starts = [start for start, _ in spans[1:]] + [len(text)]
    return [Clause(start, end, unit_end) for (start, end), unit_end in zip(spans, next_starts)]


def is_split(clause: Clause, passages: list[Passage]) -> bool:
    """No passage holds the whole clause."""
    return not any(p.start_char <= clause.start_char and clause.end_char <= p.end_char for p in passages)


def count_split(clause_list: list[Clause], passages: list[Passage]) -> int:
    return sum(is_split(clause, passages) for clause in clause_list)


def unit_tokens(clause: Clause, token_starts: list[int]) -> int:
    """Tokens that hold any of the clause or its line breaks (token_starts: each token's first char)."""
    return bisect_left(token_starts, clause.unit_end_char) - first_token_at(token_starts, clause.start_char)
