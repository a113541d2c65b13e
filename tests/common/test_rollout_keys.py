"""The rollout Redis contract against a real Redis: the state hash and its announcements."""

import json

import pytest

from common.rollout_keys import (
    PROGRESSING,
    RolloutState,
    RolloutStateError,
    claim_rollout,
    read_all_rollouts,
    read_each_rollout,
    read_rollout,
    release_rollout,
    rollout_channel,
    rollout_index_key,
    rollout_key,
    versioned_name,
    write_rollout,
)
from tests.helpers.redis_server import redis_client, redis_server  # noqa: F401  (fixtures)

SHA_A, SHA_B = "a" * 64, "0123456789abcdef" * 4
CANARY = RolloutState(stable_version="v1", stable_source="legal/v1", stable_sha256=SHA_A, canary_version="v2",
                      canary_source="legal/v2", canary_sha256=SHA_B, canary_weight=20, allow_list=("alice", "bob"),
                      phase=PROGRESSING)
FIELDS = {"stable_version", "stable_source", "stable_sha256", "canary_version", "canary_source", "canary_sha256",
          "canary_weight", "allow_list", "phase", "generation"}


def test_a_written_state_reads_back_and_the_hash_holds_the_documented_fields(redis_client):
    assert write_rollout(redis_client, "rel", "legal", CANARY) == 1
    raw = {k.decode(): v.decode() for k, v in redis_client.hgetall("rel:rollout:legal").items()}
    assert set(raw) == FIELDS
    assert (raw["canary_weight"], json.loads(raw["allow_list"]), raw["phase"]) == ("20", ["alice", "bob"], "Progressing")
    assert read_rollout(redis_client, "rel", "legal") == RolloutState(**{**CANARY.__dict__, "generation": 1})


def test_every_write_increments_the_generation_whatever_the_state_says(redis_client):
    for expected in (1, 2, 3):
        assert write_rollout(redis_client, "rel", "legal", RolloutState(**{**CANARY.__dict__, "generation": 40})) == expected
    assert read_rollout(redis_client, "rel", "legal").generation == 3


def test_writes_and_deletes_are_announced_on_the_channel_with_the_adapter_name(redis_client):
    subscriber = redis_client.pubsub()
    subscriber.subscribe(rollout_channel("rel"))
    assert subscriber.get_message(timeout=1)["type"] == "subscribe"
    write_rollout(redis_client, "rel", "legal", CANARY)
    write_rollout(redis_client, "other", "legal", CANARY)  # another release's channel
    assert release_rollout(redis_client, "rel", "legal", "test/legal/uid") == 1
    messages = [subscriber.get_message(timeout=1) for _ in range(2)]
    assert [(m["channel"], m["data"]) for m in messages] == [(b"rel:rollouts", b"legal")] * 2
    assert subscriber.get_message(timeout=0.2) is None
    subscriber.close()


def test_a_state_is_visible_when_its_announcement_arrives(redis_client):
    """The write and the publish are one transaction: a subscriber that reads on the
    message never sees the previous state."""
    subscriber = redis_client.pubsub()
    subscriber.subscribe(rollout_channel("rel"))
    subscriber.get_message(timeout=1)
    for weight in (5, 20, 50):
        write_rollout(redis_client, "rel", "legal", RolloutState(**{**CANARY.__dict__, "canary_weight": weight}))
        assert subscriber.get_message(timeout=1)["data"] == b"legal"
        assert read_rollout(redis_client, "rel", "legal").canary_weight == weight
    subscriber.close()


def test_deleting_removes_the_state_and_says_whether_there_was_one(redis_client):
    write_rollout(redis_client, "rel", "legal", CANARY)
    assert release_rollout(redis_client, "rel", "legal", "test/legal/uid") == 1
    assert read_rollout(redis_client, "rel", "legal") is None
    assert read_all_rollouts(redis_client, "rel") == {}
    assert redis_client.smembers(rollout_index_key("rel")) == set()
    assert release_rollout(redis_client, "rel", "legal", "test/legal/uid") == 0


def test_one_rollout_owns_an_adapter_and_only_its_deletion_removes_the_state(redis_client):
    assert claim_rollout(redis_client, "rel", "legal", "ns/first/1") == "ns/first/1"
    assert claim_rollout(redis_client, "rel", "legal", "ns/second/2") == "ns/first/1"
    write_rollout(redis_client, "rel", "legal", CANARY)
    assert release_rollout(redis_client, "rel", "legal", "ns/second/2") == -1  # not its state
    assert read_rollout(redis_client, "rel", "legal") is not None
    assert release_rollout(redis_client, "rel", "legal", "ns/first/1") == 1
    assert read_rollout(redis_client, "rel", "legal") is None
    assert claim_rollout(redis_client, "rel", "legal", "ns/second/2") == "ns/second/2"  # free again


def test_read_all_returns_every_adapter_of_the_release_only(redis_client):
    plain = RolloutState(stable_version="v7", stable_source="summary/v7", stable_sha256=SHA_B)
    write_rollout(redis_client, "rel", "legal", CANARY)
    write_rollout(redis_client, "rel", "summary", plain)
    write_rollout(redis_client, "rel-2", "other", plain)
    redis_client.set("rel:rollouts-not-a-hash", "x")  # a neighbouring key outside the prefix
    states = read_all_rollouts(redis_client, "rel")
    assert {name: s.canary_weight for name, s in states.items()} == {"legal": 20, "summary": 0}
    assert states["summary"].has_canary is False and states["summary"].phase == "Stable"
    assert read_all_rollouts(redis_client, "none") == {}


def test_read_all_takes_the_index_not_a_scan(redis_client):
    """Gateways read every rollout twice a second: from the release's index, never by
    scanning a keyspace that grows with the per-second buckets."""
    write_rollout(redis_client, "rel", "legal", CANARY)
    assert rollout_index_key("rel") == "rel:rollout_adapters"
    assert redis_client.smembers("rel:rollout_adapters") == {b"legal"}
    redis_client.config_resetstat()
    assert set(read_all_rollouts(redis_client, "rel")) == {"legal"}
    calls = {name.removeprefix("cmdstat_"): stats["calls"] for name, stats in redis_client.info("commandstats").items()}
    assert (calls["smembers"], calls["hgetall"]) == (1, 1) and "scan" not in calls and "keys" not in calls


@pytest.mark.parametrize("change, message", [
    ({"canary_weight": 101}, "canary_weight must be an integer percent 0..100"),
    ({"canary_weight": -1}, "canary_weight must be an integer percent 0..100"),
    ({"canary_weight": 2.5}, "canary_weight must be an integer percent 0..100"),
    ({"canary_version": "", "canary_source": "", "canary_sha256": ""}, "canary_weight must be 0 without a canary"),
    ({"canary_source": ""}, "canary_source must be a non-empty path"),
    ({"canary_version": "v1"}, "canary_version must differ from stable_version"),
    ({"stable_sha256": "A" * 64}, "stable_sha256 must be 64 lowercase hex digits"),
    ({"canary_sha256": "abc"}, "canary_sha256 must be 64 lowercase hex digits"),
    ({"stable_version": "v1@x"}, "stable_version must be 1-63 letters"),
    ({"phase": "Paused"}, "phase must be one of"),
    ({"allow_list": ("alice", 7)}, "allow_list must hold user ids"),
    ({"generation": -1}, "generation must be a non-negative integer"),
])
def test_a_state_that_breaks_the_contract_is_refused(change, message):
    with pytest.raises(RolloutStateError, match=message):
        RolloutState(**{**CANARY.__dict__, **change})


@pytest.mark.parametrize("name", ["", "a:b", "a@b", "-lead", "x" * 64, "sp ace"])
def test_adapter_names_that_would_break_keys_are_refused(redis_client, name):
    with pytest.raises(RolloutStateError, match="adapter must be 1-63"):
        rollout_key("rel", name)
    with pytest.raises(RolloutStateError, match="adapter must be 1-63"):
        write_rollout(redis_client, "rel", name, CANARY)
    with pytest.raises(RolloutStateError, match="version must be 1-63"):
        versioned_name("legal", name)


@pytest.mark.parametrize("field, value, message", [
    ("canary_weight", "lots", "invalid literal"),
    ("allow_list", "[alice", "Expecting value"),
    ("allow_list", '{"alice": 1}', "allow_list must be a JSON list"),
    ("phase", "Paused", "phase must be one of"),
])
def test_a_hash_that_breaks_the_contract_is_reported_with_its_key(redis_client, field, value, message):
    write_rollout(redis_client, "rel", "legal", CANARY)
    redis_client.hset("rel:rollout:legal", field, value)
    with pytest.raises(RolloutStateError, match=f"rel:rollout:legal: .*{message}"):
        read_rollout(redis_client, "rel", "legal")
    with pytest.raises(RolloutStateError, match="rel:rollout:legal"):
        read_all_rollouts(redis_client, "rel")


def test_each_rollout_is_read_on_its_own_and_the_broken_ones_are_named(redis_client):
    write_rollout(redis_client, "rel", "legal", CANARY)
    write_rollout(redis_client, "rel", "tax", CANARY)
    redis_client.hset("rel:rollout:tax", "phase", "Paused")
    redis_client.sadd(rollout_index_key("rel"), "bad name")
    states, broken = read_each_rollout(redis_client, "rel")
    assert set(states) == {"legal"}
    assert set(broken) == {"bad name", "tax"}
    assert "rel:rollout:tax" in broken["tax"] and "phase must be one of" in broken["tax"]
    assert "rel:rollout_adapters" in broken["bad name"] and "'bad name'" in broken["bad name"]


def test_a_hash_with_missing_fields_names_them(redis_client):
    redis_client.hset("rel:rollout:legal", mapping={"stable_version": "v1"})
    with pytest.raises(RolloutStateError, match="missing field.*stable_source"):
        read_rollout(redis_client, "rel", "legal")
