"""In which order the scheduler admits waiting sequences: a pure decision.

First come, first served makes a question about a cached document (a few dozen tokens
left to compute) wait behind every new document queued before it (thousands each).
So among waiting sequences the one with the fewest prompt tokens left to compute goes
first, which serves cache hits at once and shortens the mean wait of a queue (shortest job
first, applied to the prefill). Two kinds keep first-come-first-served order ahead of it:
a sequence already admitted once (preempted: it holds a user's partial answer), and one
that has waited `overtake_limit_s` or more, so that a steady flow of short prompts cannot
starve a long one. `overtake_limit_s` 0 is plain first-come-first-served.

Only the first ORDER_WINDOW waiting sequences are considered (the rest keep their order
behind them): the cost of a step's ordering stays bounded however long the queue grows."""

from collections.abc import Sequence as Seq

ORDER_WINDOW = 32


def admission_order(
    uncomputed: Seq[int], waited_s: Seq[float], preempted: Seq[bool], overtake_limit_s: float
) -> list[int]:
    """Indices of the waiting sequences (given in arrival order, preempted ones first) in the
    order to admit them. uncomputed[i]: prompt tokens sequence i still needs computed (after
    its cached prefix); waited_s[i]: seconds since it arrived."""

    def key(i: int) -> tuple[int, int, int]:
        if preempted[i] or waited_s[i] >= overtake_limit_s:
            return (0, 0, i)  # first come, first served, ahead of the rest
        return (1, uncomputed[i], i)

    return sorted(range(len(uncomputed)), key=key)
