"""API keys: hashed at rest, mapped to tenants, bad files refused with a clear message."""

import hashlib
import json

import pytest

from k25.cli import main
from services.gateway.api_keys import ApiKeys, ApiKeysError, hash_key


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
    (["a" * 64], "expected"),
])
def test_bad_files_are_refused(tmp_path, document, message):
    with pytest.raises(ApiKeysError, match=message):
        ApiKeys.from_file(write(tmp_path, document))


def test_missing_file_is_refused(tmp_path):
    with pytest.raises(ApiKeysError, match="cannot read"):
        ApiKeys.from_file(str(tmp_path / "absent.json"))
