"""API keys: stored only as SHA-256 hashes, each mapped to a tenant.

The keys file (mounted from a Secret) is JSON:

    {"keys": [{"sha256": "<hex digest of the key>", "tenant": "acme", "adapters": ["legal-zh"]}, ...]}

`adapters` (optional) limits the key to the base model and those LoRA adapters.
`k25 api-key` makes a key and the entry to add. A presented key is hashed and compared
with every stored hash in constant time, so neither the match nor its position leaks
through timing.
"""

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass


class ApiKeysError(Exception):
    """The keys file cannot be used."""


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return "k25-" + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Caller:
    """Who sent a request: their tenant, the adapters they may use (None: any) and a stable
    id of their key (its hash; "" when the gateway asks for no keys)."""

    tenant: str
    adapters: tuple[str, ...] | None = None
    key_id: str = ""

    def may_use(self, adapter: str) -> bool:
        return self.adapters is None or adapter in self.adapters


ANONYMOUS = Caller("default")


class ApiKeys:
    def __init__(self, hashed_to_caller: dict[str, Caller]):
        self._entries = [(bytes.fromhex(h), caller) for h, caller in hashed_to_caller.items()]

    @classmethod
    def from_file(cls, path: str) -> "ApiKeys":
        try:
            with open(path) as f:
                document = json.load(f)
        except (OSError, ValueError) as exc:
            raise ApiKeysError(f"cannot read API keys file {path}: {exc}") from None
        entries = document.get("keys") if isinstance(document, dict) else None
        if not isinstance(entries, list) or not entries:
            raise ApiKeysError(f'{path}: expected {{"keys": [{{"sha256": ..., "tenant": ...}}, ...]}} with at least one key')
        table = {}
        for position, entry in enumerate(entries):
            digest = entry.get("sha256") if isinstance(entry, dict) else None
            tenant = entry.get("tenant") if isinstance(entry, dict) else None
            if not isinstance(digest, str) or len(digest) != 64 or not _is_hex(digest):
                raise ApiKeysError(f"{path}: keys[{position}].sha256 must be 64 hex digits (the SHA-256 of the key)")
            if not isinstance(tenant, str) or not tenant:
                raise ApiKeysError(f"{path}: keys[{position}].tenant must be a non-empty string")
            adapters = entry.get("adapters")
            if adapters is not None and (not isinstance(adapters, list) or not all(isinstance(a, str) and a for a in adapters)):
                raise ApiKeysError(f"{path}: keys[{position}].adapters must be a list of adapter names")
            table[digest.lower()] = Caller(tenant, None if adapters is None else tuple(adapters), digest.lower())
        return cls(table)

    def caller_of(self, presented: str) -> Caller | None:
        digest = hashlib.sha256(presented.encode()).digest()
        found = None
        for stored, caller in self._entries:  # no early exit: every comparison is made
            if hmac.compare_digest(stored, digest):
                found = caller
        return found


def _is_hex(text: str) -> bool:
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return True
