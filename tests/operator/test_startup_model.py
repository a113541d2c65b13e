import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators.startup_model import expected_remaining, pods_to_start, ready_within, time_until_ready

SEEN = [60.0, 120.0, 180.0, 240.0]  # start-ups the pool has seen, sorted


@pytest.mark.parametrize("age, t, chance", [
    (0.0, 59.0, 0.0), (0.0, 60.0, 0.25), (0.0, 240.0, 1.0),
    (100.0, 20.0, 1 / 3),  # 120 is one of the three start-ups above 100
    (200.0, 39.0, 0.0), (200.0, 40.0, 1.0),  # only 240 is left
    (300.0, 0.0, 1.0),  # older than every pod seen: about to be ready
])
def test_the_chance_of_being_ready_is_conditioned_on_the_pods_age(age, t, chance):
    assert ready_within(SEEN, age, t) == pytest.approx(chance)


def test_the_expected_remaining_start_up_shrinks_with_age():
    assert expected_remaining(SEEN, 0.0) == pytest.approx(150.0)
    assert expected_remaining(SEEN, 150.0) == pytest.approx(60.0)  # 180 and 240 are left
    assert expected_remaining(SEEN, 400.0) == 0.0


def test_time_until_enough_pods_are_ready():
    assert time_until_ready(SEEN, (), fresh=4, missing=1) == 60.0  # one in four is ready at 60 s
    assert time_until_ready(SEEN, (), fresh=1, missing=1) == 240.0  # only when it surely is
    assert time_until_ready(SEEN, (230.0,), fresh=0, missing=1) == 10.0  # the old one is nearly ready
    assert time_until_ready(SEEN, (), fresh=2, missing=3) == math.inf
    assert time_until_ready(SEEN, (), fresh=0, missing=0) == 0.0


@pytest.mark.parametrize("ages, missing, price, most, expected", [
    ((), 2, 0.0, 10, 2),  # over capacity costs nothing: only the missing pods
    ((), 2, 60.0, 10, 8),  # 8 pods: 2 ready at 60 s, (60 + 6) x 60 beats (60 + 0) x 240
    ((), 2, 60.0, 4, 4),  # at most what the step limit allows
    ((5.0, 5.0), 2, 0.0, 10, 0),  # the starting pods are the missing ones
    ((230.0, 230.0), 2, 60.0, 10, 0),  # and nearly ready: nothing is worth starting
    ((), 0, 60.0, 10, 0),
])
def test_pods_to_start_weighs_seconds_over_capacity_against_pod_seconds(ages, missing, price, most, expected):
    assert pods_to_start(SEEN, ages, missing, price, most) == expected


def test_without_a_start_up_seen_only_the_missing_pods_start():
    assert pods_to_start([], (), 3, 60.0, 10) == 3


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(1, 600), min_size=1, max_size=12).map(sorted),
       st.lists(st.floats(0, 700), max_size=8).map(tuple), st.integers(0, 12), st.floats(0, 500), st.integers(0, 30))
def test_pods_to_start_covers_the_missing_within_the_limit(samples, ages, missing, price, most):
    started = pods_to_start(samples, ages, missing, price, most)
    assert min(max(0, missing - len(ages)), most) <= started <= most
    cheaper = pods_to_start(samples, ages, missing, price / 2, most)
    assert cheaper <= started  # a lower price of being over capacity never starts more
