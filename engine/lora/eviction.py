"""Which cached entry to give up: the least recently used one that nothing running uses."""

from collections.abc import Hashable, Iterable


def least_recent_idle(order: Iterable[Hashable], busy: set) -> Hashable | None:
    """The first of `order` (least recently used first) not in `busy`; None if all are busy."""
    return next((entry for entry in order if entry not in busy), None)
