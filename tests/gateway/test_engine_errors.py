"""What the gateway remembers of the errors it saw per engine: for a window, until the engine
serves again, at most a bounded number each, and only for engines still registered."""

import pytest

from services.gateway.engine_errors import MAX_REMEMBERED, RecentErrors


def test_errors_count_within_the_window_only():
    errors = RecentErrors(window_s=30)
    errors.failed("a", 100.0)
    errors.failed("a", 120.0)
    errors.failed("b", 110.0)
    assert errors.counts(125.0) == {"a": 2, "b": 1}
    assert errors.counts(135.0) == {"a": 1, "b": 1}
    assert errors.counts(150.0) == {}


def test_an_engine_that_serves_again_is_forgiven():
    errors = RecentErrors(window_s=30)
    errors.failed("a", 100.0)
    errors.served("a")
    errors.served("never-failed")
    assert errors.counts(101.0) == {}


def test_engines_that_left_the_registry_are_forgotten():
    errors = RecentErrors(window_s=30)
    errors.failed("gone", 100.0)
    errors.failed("here", 100.0)
    errors.retain({"here", "other"})
    assert errors.counts(101.0) == {"here": 1}


def test_failures_kept_per_engine_are_bounded():
    errors = RecentErrors(window_s=30)
    for i in range(10 * MAX_REMEMBERED):
        errors.failed("a", 100.0 + i / 1000)
    assert errors.counts(110.0) == {"a": MAX_REMEMBERED}


@pytest.mark.parametrize("window_s", [0, -1])
def test_the_window_must_be_positive(window_s):
    with pytest.raises(ValueError, match="positive"):
        RecentErrors(window_s)
