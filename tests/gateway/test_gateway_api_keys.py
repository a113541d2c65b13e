"""API keys: hashed at rest, mapped to tenants with their limits, bad files refused with a
clear message, and a changed file re-read (a bad change keeps the keys read before)."""

import hashlib
import json
import logging
import os

import pytest

from k25.cli import main
from services.gateway.api_keys import RELOAD_CHECK_S, ApiKeys, ApiKeysError, ApiKeysFile, hash_key
from services.gateway.tenant_limits import TenantLimits


def write(tmp_path, document) -> str:
    path = tmp_path / "keys.json"
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return str(path)


def test_keys_map_to_tenants(tmp_path):
    keys = ApiKeys.from_file(write(tmp_path, {"keys": [
        {"sha256": hashlib.sha256(b"alpha-key").hexdigest(), "tenant": "alpha"},
        {"sha256": hashlib.sha256(b"beta-key").hexdigest().upper(), "tenant": "beta", "adapters": ["legal"]},
    ]}))
    alpha, beta = keys.caller_of("alpha-key"), keys.caller_of("beta-key")
    assert alpha.tenant == "alpha" and alpha.may_use("anything")
    assert beta.tenant == "beta" and beta.may_use("legal") and not beta.may_use("medical")
    assert beta.key_id == hashlib.sha256(b"beta-key").hexdigest()
    assert keys.caller_of("alpha-key ") is None
    assert keys.caller_of("") is None
    assert not alpha.admin and not beta.admin


def test_an_admin_key_is_marked_so_and_made_with_admin(tmp_path, capsys):
    assert main(["api-key", "--tenant", "compliance", "--admin"]) == 0
    lines = capsys.readouterr().out.splitlines()
    key, entry = lines[0].rsplit(" ", 1)[1], json.loads(lines[-1])
    assert entry == {"sha256": hash_key(key), "tenant": "compliance", "admin": True}
    assert ApiKeys.from_file(write(tmp_path, {"keys": [entry]})).caller_of(key).admin


def test_the_file_holds_no_key_in_clear(tmp_path, capsys):
    assert main(["api-key", "--tenant", "acme"]) == 0
    lines = capsys.readouterr().out.splitlines()
    key = lines[0].rsplit(" ", 1)[1]
    entry = json.loads(lines[-1])
    assert key not in lines[-1] and entry == {"sha256": hash_key(key), "tenant": "acme"}
    assert ApiKeys.from_file(write(tmp_path, {"keys": [entry]})).caller_of(key).tenant == "acme"


@pytest.mark.parametrize("document, message", [
    ("not json", "cannot read"),
    ({"keys": []}, "at least one key"),
    ({"keys": [{"sha256": "abc", "tenant": "t"}]}, "64 hex digits"),
    ({"keys": [{"sha256": "g" * 64, "tenant": "t"}]}, "64 hex digits"),
    ({"keys": [{"sha256": "a" * 64, "tenant": ""}]}, "tenant must be"),
    ({"keys": [{"sha256": "a" * 64, "tenant": "t", "adapters": "legal"}]}, "adapters must be"),
    ({"keys": [{"sha256": "a" * 64, "tenant": "t", "admin": "yes"}]}, "admin must be true or false"),
    (["a" * 64], "expected"),
    ({"keys": [{"sha256": "a" * 64, "tenant": "t"}], "tenants": []}, "tenants must be an object"),
    ({"keys": [{"sha256": "a" * 64, "tenant": "t"}], "tenants": {"t": {"tokens_per_hour": 5}}}, "only max_concurrent"),
    ({"keys": [{"sha256": "a" * 64, "tenant": "t"}], "tenants": {"t": {"tokens_per_minute": 0}}}, "positive integer"),
    ({"keys": [{"sha256": "a" * 64, "tenant": "t"}], "tenants": {"t": {"max_concurrent_requests": True}}}, "positive"),
    ({"keys": [{"sha256": "a" * 64, "tenant": "t"}], "tenants": {"t": {"tokens_per_minute": 1.5}}}, "positive integer"),
    ({"keys": [{"sha256": "a" * 64, "tenant": "t"}], "tenants": {"t": 5}}, "must be an object"),
])
def test_bad_files_are_refused(tmp_path, document, message):
    with pytest.raises(ApiKeysError, match=message):
        ApiKeys.from_file(write(tmp_path, document))


def test_missing_file_is_refused(tmp_path):
    with pytest.raises(ApiKeysError, match="cannot read"):
        ApiKeys.from_file(str(tmp_path / "absent.json"))


def test_tenants_have_their_limits_and_others_none(tmp_path):
    keys = ApiKeys.from_file(write(tmp_path, {
        "keys": [{"sha256": hash_key("k"), "tenant": "acme"}],
        "tenants": {"acme": {"max_concurrent_requests": 4, "tokens_per_minute": 1000}, "globex": {"tokens_per_minute": None}},
    }))
    assert keys.limits_of("acme") == TenantLimits(max_concurrent_requests=4, tokens_per_minute=1000)
    assert keys.limits_of("globex") == TenantLimits()
    assert keys.limits_of("initech") is None


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_changed_file_is_re_read_at_most_once_a_second(tmp_path):
    path = write(tmp_path, {"keys": [{"sha256": hash_key("old"), "tenant": "acme"}]})
    clock = Clock()
    keys = ApiKeysFile(path, clock)
    replacement = tmp_path / "new.json"
    replacement.write_text(json.dumps({"keys": [{"sha256": hash_key("new"), "tenant": "acme"}]}))
    os.replace(replacement, path)
    assert keys.caller_of("old") is not None  # not looked at yet
    clock.now += RELOAD_CHECK_S
    assert keys.caller_of("old") is None and keys.caller_of("new").tenant == "acme"


@pytest.mark.parametrize("change", ["broken", "removed"])
def test_a_file_that_breaks_or_goes_keeps_the_keys_read_before(tmp_path, caplog, change):
    path = write(tmp_path, {"keys": [{"sha256": hash_key("old"), "tenant": "acme"}]})
    clock = Clock()
    keys = ApiKeysFile(path, clock)
    if change == "broken":
        write(tmp_path, '{"keys": [')
    else:
        os.remove(path)
    with caplog.at_level(logging.WARNING, logger="services.gateway.api_keys"):
        for _ in range(3):
            clock.now += RELOAD_CHECK_S
            assert keys.caller_of("old").tenant == "acme"
    assert len([r for r in caplog.records if "keeping the keys read before" in r.message]) == 1  # once per version
    # (a size of its own: an in-place rewrite of the same size within one timestamp tick looks unchanged)
    write(tmp_path, {"keys": [{"sha256": hash_key("new"), "tenant": "acme-2"}]})
    clock.now += RELOAD_CHECK_S
    assert keys.caller_of("new").tenant == "acme-2" and keys.caller_of("old") is None
