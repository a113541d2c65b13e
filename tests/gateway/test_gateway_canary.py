"""Which adapter version a request gets: placement by a stable hash, allow-lists, pinning;
anonymous requests split one by one; what counts in a version's statistics."""

import math
import time

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace

from common.rollout_keys import PROGRESSING, RolloutState
from common.tokenizer import load_tokenizer
from proto import k25_pb2
from services.gateway.canary import (
    CANARY,
    PINNED,
    STABLE,
    AdapterChoice,
    UnknownModel,
    canary_outcome,
    choose_adapter,
    place,
    placement_key,
    user_bucket,
)
from services.gateway.dispatch import Job
from services.gateway.outcome import RequestOutcome
from services.gateway.request_id import new_request_id
from services.gateway.service import Gateway
from services.gateway.settings import GatewaySettings

SHA = "a" * 64


def rollout(weight: int, allow=()) -> RolloutState:
    return RolloutState("v1", "legal/v1", SHA, "v2", "legal/v2", SHA, weight, tuple(allow), PROGRESSING)


USERS = [f"user-{i}" for i in range(5000)]


def test_buckets_are_stable_and_spread_evenly():
    assert user_bucket("legal", "alice") == user_bucket("legal", "alice")
    counts = [0] * 100
    for user in USERS:
        counts[user_bucket("legal", user)] += 1
    assert min(counts) > 20 and max(counts) < 85  # 50 expected in each


@pytest.mark.parametrize("weight", [0, 5, 20, 50, 100])
def test_the_canary_share_follows_the_weight(weight):
    on_canary = sum(place("legal", rollout(weight), u).group == CANARY for u in USERS)
    assert abs(on_canary / len(USERS) - weight / 100) < 0.03


@given(st.integers(0, 100), st.integers(0, 100), st.text(min_size=1, max_size=20))
def test_raising_the_weight_never_moves_a_user_back_to_stable(low, high, user):
    low, high = min(low, high), max(low, high)
    if place("legal", rollout(low), user).group == CANARY:
        assert place("legal", rollout(high), user).group == CANARY


def test_allow_listed_users_always_get_the_canary():
    assert place("legal", rollout(0, allow=["qa-bot"]), "qa-bot") == AdapterChoice("legal", "v2", CANARY)


def test_without_a_canary_everyone_gets_stable():
    state = RolloutState("v1", "legal/v1", SHA)
    assert {place("legal", state, u).version for u in USERS[:200]} == {"v1"}


BASE = {"smollm2-135m", "base"}


def test_base_model_names_choose_no_adapter():
    assert choose_adapter("base", BASE, {}, set(), "u") is None
    assert choose_adapter("smollm2-135m", BASE, {}, set(), "u") is None


def test_pinned_versions():
    rollouts = {"legal": rollout(5)}
    assert choose_adapter("legal@v2", BASE, rollouts, set(), "u") == AdapterChoice("legal", "v2", PINNED)
    assert choose_adapter("med@v7", BASE, {}, {"med@v7"}, "u") == AdapterChoice("med", "v7", PINNED)
    with pytest.raises(UnknownModel, match="no version 'v9'"):
        choose_adapter("legal@v9", BASE, rollouts, {"legal@v1"}, "u")


def test_an_adapter_without_a_rollout_is_served_in_the_version_the_engines_hold():
    assert choose_adapter("med", BASE, {}, {"med@v3", "legal@v1"}, "u") == AdapterChoice("med", "v3", STABLE)
    with pytest.raises(UnknownModel, match="name one as med@VERSION"):
        choose_adapter("med", BASE, {}, {"med@v3", "med@v4"}, "u")
    with pytest.raises(UnknownModel, match="does not exist"):
        choose_adapter("gpt-4o", BASE, {}, {"med@v3"}, "u")


def test_an_adapter_with_a_rollout_is_placed_by_user():
    rollouts = {"legal": rollout(50)}
    choices = {choose_adapter("legal", BASE, rollouts, {"legal@v1", "legal@v2"}, u).version for u in USERS[:100]}
    assert choices == {"v1", "v2"}


def test_canary_users_get_stable_until_an_engine_holds_the_canary():
    rollouts = {"legal": rollout(100)}
    assert choose_adapter("legal", BASE, rollouts, {"legal@v1"}, "u") == AdapterChoice("legal", "v1", STABLE)


def test_a_request_is_placed_by_its_user_else_its_key_else_itself():
    assert placement_key("alice", "keyhash", "req_1") == "alice"
    assert placement_key(None, "keyhash", "req_1") == placement_key("", "keyhash", "req_2") == "keyhash"
    assert placement_key(None, "", "req_1") != placement_key(None, "", "req_2")


@pytest.mark.parametrize("weight", [5, 30])
def test_anonymous_requests_split_by_the_weight(weight):
    """Each anonymous request is placed by its own random request id: the canary's share of n
    requests is Binomial(n, p); Hoeffding's bound P(|share - p| >= t) <= 2 exp(-2 n t^2) gives
    the t at which this test fails by chance once in 10^9 runs."""
    n, p = 20_000, weight / 100
    t = math.sqrt(math.log(2 / 1e-9) / (2 * n))
    rollouts, loaded = {"legal": rollout(weight)}, {"legal@v1", "legal@v2"}
    groups = [choose_adapter("legal", BASE, rollouts, loaded, placement_key(None, "", new_request_id())).group
              for _ in range(n)]
    assert set(groups) == {STABLE, CANARY}
    assert abs(groups.count(CANARY) / n - p) < t


def test_identified_callers_stay_on_their_side():
    rollouts, loaded = {"legal": rollout(50)}, {"legal@v1", "legal@v2"}
    for user, key_id in [("alice", ""), (None, "keyhash")]:
        versions = {choose_adapter("legal", BASE, rollouts, loaded, placement_key(user, key_id, new_request_id())).version
                    for _ in range(20)}
        assert len(versions) == 1


@pytest.mark.parametrize("group, status, counted", [
    (CANARY, 200, False), (STABLE, 200, False),
    (CANARY, 500, True), (CANARY, 502, True), (CANARY, 504, True),
    (CANARY, 503, None),  # adapter_loading, overloaded: the fleet, not the version
    (CANARY, 400, None), (CANARY, 404, None), (CANARY, 499, None),  # the client's doing
    (PINNED, 200, None), (PINNED, 500, None),  # the client chose the version, not the split
])
def test_the_canary_statistics_count_only_what_the_split_sent_and_an_engine_ran(group, status, counted):
    assert canary_outcome(group, status) is counted


def test_a_pinned_request_leaves_no_trace_in_the_version_statistics():
    gateway = Gateway(GatewaySettings(model="tiny-random"), load_tokenizer("tiny-random"), redis.Redis(port=1))
    for group, status in ((PINNED, 500), (CANARY, 503), (CANARY, 500), (STABLE, 200)):
        job = Job(request_id=f"r-{group}-{status}", tenant="t", model="legal", prompt_token_ids=[5],
                  sampling=k25_pb2.SamplingParams(max_tokens=1), deadline=time.time() + 60,
                  adapter=AdapterChoice("legal", "v2" if group == CANARY else "v1", group))
        RequestOutcome(gateway, "default", time.time(), job, False, trace.INVALID_SPAN).done(status)
    pending = gateway.accounting.pending.versions
    counted = {(adapter, version): (c.requests, c.errors) for (adapter, version, _, _), c in pending.items()}
    assert counted == {("legal", "v2"): (1, 1), ("legal", "v1"): (1, 0)}
