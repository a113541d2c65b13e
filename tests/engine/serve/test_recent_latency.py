"""The heartbeat's recent TTFT percentile: nearest rank (numpy's inverted_cdf is the reference)
over the values of the last window, bounded in size."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.serve.recent_latency import RecentPercentile


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.floats(0, 1e4), min_size=1, max_size=300), quantile=st.floats(0.01, 1.0))
def test_the_percentile_is_numpys_nearest_rank(values, quantile):
    recent = RecentPercentile(quantile, window_s=60.0)
    for n, value in enumerate(values):
        recent.add(n * 0.01, value)
    assert recent.value(len(values) * 0.01) == np.percentile(values, quantile * 100, method="inverted_cdf")


def test_values_older_than_the_window_leave_it():
    recent = RecentPercentile(0.95, window_s=60.0)
    assert recent.value(0.0) is None
    recent.add(0.0, 30.0)
    recent.add(50.0, 1.0)
    assert recent.value(55.0) == 30.0  # both in the window: the worst
    assert recent.value(60.0) == 1.0  # the first is a window old
    assert recent.value(110.0) is None  # neither is left


def test_only_the_newest_samples_are_kept():
    recent = RecentPercentile(1.0, window_s=60.0, max_samples=3)
    for n, value in enumerate([100.0, 1.0, 2.0, 3.0]):
        recent.add(n, value)
    assert recent.value(4.0) == 3.0


@pytest.mark.parametrize("quantile, window_s, max_samples", [(0.0, 60, 10), (1.5, 60, 10), (0.95, 0, 10), (0.95, 60, 0)])
def test_nonsense_is_refused(quantile, window_s, max_samples):
    with pytest.raises(ValueError, match="need 0 < quantile"):
        RecentPercentile(quantile, window_s, max_samples)
