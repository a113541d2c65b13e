"""API keys: stored only as SHA-256 hashes, each mapped to a tenant.

The keys file (mounted from a Secret) is JSON:

    {"keys": [{"sha256": "<hex digest of the key>", "tenant": "acme", "adapters": ["legal-zh"]},
              {"sha256": "...", "tenant": "compliance", "admin": true}, ...],
     "tenants": {"acme": {"max_concurrent_requests": 8, "tokens_per_minute": 200000}}}

`adapters` (optional) limits the key to the base model and those LoRA adapters. `admin`
(optional, false) lets the key see every tenant's stored documents: list, show and delete them
(its own questions and uploads stay its tenant's).
`tenants` (optional) limits a tenant's requests in flight and its tokens per minute
(prompt + max_tokens), over all its keys; a tenant not named there, or a limit left out,
is unlimited. `k25 api-key` makes a key and the entry to add. A presented key is hashed
and compared with every stored hash in constant time, so neither the match nor its
position leaks through timing.

The gateway re-reads the file when it changes (`ApiKeysFile`), so a key added or revoked
in the Secret takes effect without a restart.
"""

import hashlib
import hmac
import json
import logging
import os
import secrets
import time
from dataclasses import dataclass

from services.gateway.tenant_limits import TenantLimits

log = logging.getLogger(__name__)

# the file is looked at (one stat) at most this often
RELOAD_CHECK_S = 1.0
_LIMIT_FIELDS = ("max_concurrent_requests", "tokens_per_minute")
_NO_VERSION = object()


class ApiKeysError(Exception):
    """The keys file cannot be used."""


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return "k25-" + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Caller:
    """Who sent a request: their tenant, the adapters they may use (None: any), a stable id of
    their key (its hash; "" when the gateway asks for no keys), and whether the key may see
    every tenant's documents."""

    tenant: str
    adapters: tuple[str, ...] | None = None
    key_id: str = ""
    admin: bool = False

    def may_use(self, adapter: str) -> bool:
        return self.adapters is None or adapter in self.adapters


ANONYMOUS = Caller("default")


class ApiKeys:
    def __init__(self, hashed_to_caller: dict[str, Caller], tenant_limits: dict[str, TenantLimits] | None = None):
        self._entries = [(bytes.fromhex(h), caller) for h, caller in hashed_to_caller.items()]
        self._tenant_limits = tenant_limits or {}

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
            admin = entry.get("admin", False)
            if not isinstance(admin, bool):
                raise ApiKeysError(f"{path}: keys[{position}].admin must be true or false")
            table[digest.lower()] = Caller(tenant, None if adapters is None else tuple(adapters), digest.lower(), admin)
        return cls(table, _tenant_limits(path, document.get("tenants", {})))

    def caller_of(self, presented: str) -> Caller | None:
        digest = hashlib.sha256(presented.encode()).digest()
        found = None
        for stored, caller in self._entries:  # no early exit: every comparison is made
            if hmac.compare_digest(stored, digest):
                found = caller
        return found

    def limits_of(self, tenant: str) -> TenantLimits | None:
        return self._tenant_limits.get(tenant)


def _tenant_limits(path: str, tenants) -> dict[str, TenantLimits]:
    if not isinstance(tenants, dict):
        raise ApiKeysError(f'{path}: tenants must be an object {{"<tenant>": {{"max_concurrent_requests": ..., '
                           f'"tokens_per_minute": ...}}}}')
    limits = {}
    for tenant, fields in tenants.items():
        if not isinstance(fields, dict) or set(fields) - set(_LIMIT_FIELDS):
            raise ApiKeysError(f"{path}: tenants.{tenant} must be an object with only {' and '.join(_LIMIT_FIELDS)}")
        for name, value in fields.items():
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ApiKeysError(f"{path}: tenants.{tenant}.{name} must be a positive integer (or null: no limit)")
        limits[tenant] = TenantLimits(**fields)
    return limits


class ApiKeysFile:
    """The keys of a file that may change while the gateway runs: re-read when its identity
    (inode, size or modification time of what the path points to) changes, looked at no more
    than once a second. A Secret volume swaps a symbolic link to publish a new version, which
    changes the inode. A file that cannot be read or is not valid keeps the keys read before."""

    def __init__(self, path: str, clock=time.monotonic):
        self.path = path
        self._clock = clock
        self._identity = _identity(path)
        self._keys = ApiKeys.from_file(path)
        self._checked_at = clock()
        self._refused = _NO_VERSION  # the identity of a version that could not be used (logged once)

    def current(self) -> ApiKeys:
        now = self._clock()
        if now - self._checked_at >= RELOAD_CHECK_S:
            self._checked_at = now
            self._reload_if_changed()
        return self._keys

    def caller_of(self, presented: str) -> Caller | None:
        return self.current().caller_of(presented)

    def limits_of(self, tenant: str) -> TenantLimits | None:
        return self.current().limits_of(tenant)

    def _reload_if_changed(self) -> None:
        identity = _identity(self.path)
        if identity == self._identity or identity == self._refused:
            return
        try:
            keys = ApiKeys.from_file(self.path)
        except ApiKeysError as exc:
            log.warning("API keys file changed but cannot be used; keeping the keys read before: %s", exc)
            self._refused = identity
            return
        self._keys, self._identity, self._refused = keys, identity, _NO_VERSION
        log.info("API keys re-read from %s", self.path)


def _identity(path: str) -> tuple | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def _is_hex(text: str) -> bool:
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return True
