"""The Redis contract for LoRA adapter rollouts, shared by the operator (writes the state),
the engines (load what it names) and the gateways (split traffic by it, count outcomes).

Every key starts with the release name, as in `common.redis_keys`. Adapter names and versions
are 1-63 characters of letters, digits, `.`, `_` and `-`, starting with a letter or digit
(so `@` and `:` can separate them in keys and model names).

Rollout state, one hash per adapter:

    {release}:rollout:{adapter}     hash
        stable_version, stable_source, stable_sha256    the version everyone gets by default
        canary_version, canary_source, canary_sha256    the version on trial; all three empty
                                                         when there is none
        canary_weight   integer percent 0..100 of users placed on the canary (0 without one)
        allow_list      JSON list of user ids that always get the canary
        phase           Progressing | Promoted | RolledBack | Stable (Stable: one version
                        served and no rollout has run; the operator writes the other three)
        generation      integer, incremented on every write

The adapters that have one are listed in an index, so that reading every rollout takes
one SMEMBERS and one pipelined round of HGETALLs, never a SCAN of the keyspace:

    {release}:rollout_adapters      set of adapter names

`write_rollout` sets every field, increments `generation` and adds the adapter to the index
in one transaction, then publishes the adapter's name on

    {release}:rollouts              pub/sub channel, message: the adapter name

so that engines hot-load (and unload) versions and gateways re-read weights at once.
`release_rollout` removes an adapter's hash and its index entry and announces that the same
way; a reader that finds no hash after an announcement stops serving the adapter. One
AdapterRollout owns an adapter's state (`{release}:rollout_owner:{adapter}`, `claim_rollout`):
only its deletion removes the state. `source`
is a path under the engine's adapter root; `sha256` is 64 hex digits, the engine's adapter
checksum (`cat adapter_config.json adapter_model.safetensors | sha256sum`).

Engines report what they hold in their registry heartbeat (`{release}:engines`,
`common.redis_keys.live_engines`): the field `adapters`, a list of `versioned_name(adapter,
version)` strings ("name@version").

The outcomes the gateways count per adapter version, which the canary checks read, are in
`common.adapter_stats`.
"""

import json
import re
from dataclasses import dataclass, fields

PROGRESSING, PROMOTED, ROLLED_BACK, STABLE = "Progressing", "Promoted", "RolledBack", "Stable"
PHASES = (PROGRESSING, PROMOTED, ROLLED_BACK, STABLE)

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
SHA256_PATTERN = re.compile(r"[0-9a-f]{64}")


class RolloutStateError(ValueError):
    """A rollout state that breaks the contract; the message says which field and why."""


def check_name(what: str, value: str) -> str:
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        raise RolloutStateError(f"{what} must be 1-63 letters, digits, '.', '_' or '-' starting with a letter "
                                f"or digit, got {value!r}")
    return value


def versioned_name(adapter: str, version: str) -> str:
    """"name@version": how engines list the adapters they hold and clients may name one."""
    return f"{check_name('adapter', adapter)}@{check_name('version', version)}"


def rollout_key(release: str, adapter: str) -> str:
    return f"{release}:rollout:{check_name('adapter', adapter)}"


def rollout_index_key(release: str) -> str:
    return f"{release}:rollout_adapters"


def rollout_channel(release: str) -> str:
    return f"{release}:rollouts"


@dataclass(frozen=True)
class RolloutState:
    stable_version: str
    stable_source: str
    stable_sha256: str
    canary_version: str = ""
    canary_source: str = ""
    canary_sha256: str = ""
    canary_weight: int = 0
    allow_list: tuple[str, ...] = ()
    phase: str = STABLE
    generation: int = 0  # the store's: `write_rollout` ignores it, `read_rollout` fills it in

    def __post_init__(self):
        object.__setattr__(self, "allow_list", tuple(self.allow_list))
        self._check_version("stable", self.stable_version, self.stable_source, self.stable_sha256)
        canary = (self.canary_version, self.canary_source, self.canary_sha256)
        if any(canary):
            self._check_version("canary", *canary)
            if self.canary_version == self.stable_version:
                raise RolloutStateError(f"canary_version must differ from stable_version ({self.stable_version!r})")
        weight = self.canary_weight
        if isinstance(weight, bool) or not isinstance(weight, int) or not 0 <= weight <= 100:
            raise RolloutStateError(f"canary_weight must be an integer percent 0..100, got {weight!r}")
        if weight and not self.has_canary:
            raise RolloutStateError(f"canary_weight must be 0 without a canary, got {weight}")
        if not all(isinstance(user, str) for user in self.allow_list):
            raise RolloutStateError(f"allow_list must hold user ids (strings), got {list(self.allow_list)!r}")
        if self.phase not in PHASES:
            raise RolloutStateError(f"phase must be one of {', '.join(PHASES)}, got {self.phase!r}")
        if isinstance(self.generation, bool) or not isinstance(self.generation, int) or self.generation < 0:
            raise RolloutStateError(f"generation must be a non-negative integer, got {self.generation!r}")

    @property
    def has_canary(self) -> bool:
        return bool(self.canary_version)

    @staticmethod
    def _check_version(which: str, version: str, source: str, sha256: str) -> None:
        check_name(f"{which}_version", version)
        if not isinstance(source, str) or not source:
            raise RolloutStateError(f"{which}_source must be a non-empty path, got {source!r}")
        if not isinstance(sha256, str) or not SHA256_PATTERN.fullmatch(sha256):
            raise RolloutStateError(f"{which}_sha256 must be 64 lowercase hex digits, got {sha256!r}")


def write_rollout(redis, release: str, adapter: str, state: RolloutState) -> int:
    """Store `state` as the adapter's rollout state and announce it; returns the new generation.
    `redis` is a client (the write is one MULTI/EXEC transaction)."""
    fields_ = {f.name: getattr(state, f.name) for f in fields(state) if f.name != "generation"}
    fields_["canary_weight"] = str(state.canary_weight)
    fields_["allow_list"] = json.dumps(list(state.allow_list))
    key = rollout_key(release, adapter)
    pipe = redis.pipeline(transaction=True)
    pipe.hset(key, mapping=fields_)
    pipe.hincrby(key, "generation", 1)
    pipe.sadd(rollout_index_key(release), adapter)
    pipe.publish(rollout_channel(release), adapter)
    _, generation, _, _ = pipe.execute()
    return generation


def rollout_owner_key(release: str, adapter: str) -> str:
    """"namespace/name/uid" of the one AdapterRollout that writes the adapter's state."""
    return f"{release}:rollout_owner:{adapter}"


def claim_rollout(redis, release: str, adapter: str, owner: str) -> str:
    """The owner of the adapter's rollout: `owner` when it had none (it has now), else the one
    that had it first. Two AdapterRollouts for one adapter would otherwise overwrite each
    other's state at every tick."""
    key = rollout_owner_key(release, adapter)
    redis.set(key, owner, nx=True)
    return _text(redis.get(key) or owner)


# the owner's deletion removes the state and the claim; another rollout's, nothing
_RELEASE = """
local owner = redis.call('GET', KEYS[1])
if owner and owner ~= ARGV[1] then return -1 end
redis.call('DEL', KEYS[1])
local deleted = redis.call('DEL', KEYS[2])
redis.call('SREM', KEYS[3], ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[2])
return deleted
"""


def release_rollout(redis, release: str, adapter: str, owner: str) -> int:
    """When `owner` owns the adapter's rollout (or nobody does): remove its state and the claim,
    announce it, and return 1 (0: there was no state); -1, changing nothing, when another owns it."""
    keys = [rollout_owner_key(release, adapter), rollout_key(release, adapter), rollout_index_key(release)]
    return int(redis.register_script(_RELEASE)(keys=keys, args=[owner, adapter, rollout_channel(release)]))


def read_rollout(redis, release: str, adapter: str) -> RolloutState | None:
    """The adapter's rollout state, or None when it has none. Raises RolloutStateError for
    a hash that breaks the contract."""
    key = rollout_key(release, adapter)
    return _parse_state(key, redis.hgetall(key))


def read_all_rollouts(redis, release: str) -> dict[str, RolloutState]:
    """Every adapter's rollout state: adapter name -> state, in name order. Raises
    RolloutStateError for the first hash that breaks the contract (see read_each_rollout)."""
    states, broken = _read_rollouts(redis, release, check_names=False)
    if broken:
        raise RolloutStateError(next(iter(broken.values())))
    return states


def read_each_rollout(redis, release: str) -> tuple[dict[str, RolloutState], dict[str, str]]:
    """Every adapter's rollout state, in name order, and apart from them each member of the
    index whose name or hash breaks the contract, with why: one malformed member costs only
    its own adapter."""
    return _read_rollouts(redis, release, check_names=True)


def _read_rollouts(redis, release: str, check_names: bool) -> tuple[dict[str, RolloutState], dict[str, str]]:
    broken, adapters = {}, []
    for raw_member in sorted(redis.smembers(rollout_index_key(release))):
        try:
            member = _text(raw_member)
        except UnicodeDecodeError:  # named by its bytes' repr, which is text
            member = repr(raw_member)
            broken[member] = f"{rollout_index_key(release)}: a member that is not UTF-8 text: {member}"
            continue
        try:
            adapters.append(check_name("adapter", member) if check_names else member)
        except RolloutStateError as error:
            broken[member] = f"{rollout_index_key(release)}: {error}"
    pipe = redis.pipeline(transaction=False)
    for adapter in adapters:
        pipe.hgetall(rollout_key(release, adapter))
    states = {}
    for adapter, raw in zip(adapters, pipe.execute() if adapters else []):
        try:
            state = _parse_state(rollout_key(release, adapter), raw)
        except RolloutStateError as error:
            broken[adapter] = str(error)
            continue
        if state is not None:  # deleted between SMEMBERS and HGETALL
            states[adapter] = state
    return states, dict(sorted(broken.items()))


def _parse_state(key: str, raw: dict) -> RolloutState | None:
    if not raw:
        return None
    try:
        values = {_text(k): _text(v) for k, v in raw.items()}
    except UnicodeDecodeError as error:
        raise RolloutStateError(f"{key}: a field that is not UTF-8 text ({error})") from error
    names = [f.name for f in fields(RolloutState)]
    missing = [name for name in names if name not in values]
    if missing:
        raise RolloutStateError(f"{key}: missing field(s) {', '.join(missing)}")
    try:
        values["canary_weight"] = int(values["canary_weight"])
        values["generation"] = int(values["generation"])
        values["allow_list"] = json.loads(values["allow_list"])
    except ValueError as error:
        raise RolloutStateError(f"{key}: {error}") from error
    if not isinstance(values["allow_list"], list):
        raise RolloutStateError(f"{key}: allow_list must be a JSON list, got {values['allow_list']!r}")
    try:
        return RolloutState(**{name: values[name] for name in names})
    except RolloutStateError as error:
        raise RolloutStateError(f"{key}: {error}") from error


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value
