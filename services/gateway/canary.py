"""Which adapter version a request gets. Pure functions.

A client names the base model (`base` or the served model name), an adapter (`name`: the
rollout decides the version) or one version (`name@version`, pinned). With a rollout, a
user is placed by a stable hash of their id into one of 100 buckets: buckets below the
canary weight get the canary, so one user sees one version during a step, and raising
the weight only ever moves users from stable to canary. Users on the allow-list always
get the canary. Until some engine reports the canary loaded, its users get stable.

A request that names no `user` is placed by its API key; one without either (no keys file)
is placed on its own, by its request id, so that anonymous traffic splits by the weight
rather than all landing on one side.

The statistics that promote or roll back a canary count only what the split decided and what
the version's engines did with it (`canary_outcome`): not pinned requests, which a client
could send to make a version look good or bad, nor refusals before any engine ran it. A
client still chooses its `user` values, and so which side its requests land on: each outcome
is booked with the caller's tenant, and the checks weigh the tenants rather than the requests
(common/adapter_stats.py), so that no one tenant decides a verdict.
"""

import hashlib
from dataclasses import dataclass

from common.rollout_keys import RolloutState

STABLE, CANARY, PINNED = "stable", "canary", "pinned"


@dataclass(frozen=True)
class AdapterChoice:
    name: str
    version: str
    group: str  # stable, canary or pinned: the `ab_group` of its metrics

    @property
    def key(self) -> str:
        return f"{self.name}@{self.version}"


class UnknownModel(Exception):
    pass


def user_bucket(adapter: str, user: str) -> int:
    """0..99, the same for one user and adapter on every gateway and every run."""
    return int.from_bytes(hashlib.sha256(f"{adapter}\0{user}".encode()).digest()[:8], "big") % 100


def placement_key(user: str | None, key_id: str, request_id: str) -> str:
    """Who a request counts as for the split: its user, else its API key, else only itself."""
    return user or key_id or f"request:{request_id}"


def place(adapter: str, state: RolloutState, user: str) -> AdapterChoice:
    if state.has_canary and (user in state.allow_list or user_bucket(adapter, user) < state.canary_weight):
        return AdapterChoice(adapter, state.canary_version, CANARY)
    return AdapterChoice(adapter, state.stable_version, STABLE)


def choose_adapter(model: str, base_names: set[str], rollouts: dict[str, RolloutState], loaded: set[str],
                   user: str) -> AdapterChoice | None:
    """None for the base model. `loaded` holds the "name@version" the live engines report;
    an adapter without a rollout is served in the one version the engines hold."""
    if model in base_names:
        return None
    name, _, version = model.partition("@")
    if version:
        state = rollouts.get(name)
        known = {state.stable_version, state.canary_version} - {""} if state else set()
        if model in loaded or version in known:
            return AdapterChoice(name, version, PINNED)
        raise UnknownModel(f"no version {version!r} of adapter {name!r} is served")
    if name in rollouts:
        choice = place(name, rollouts[name], user)
        if choice.group == CANARY and choice.key not in loaded:  # no engine holds it yet: stable meanwhile
            return AdapterChoice(name, rollouts[name].stable_version, STABLE)
        return choice
    versions = sorted(v for n, _, v in (key.partition("@") for key in loaded) if n == name)
    if len(versions) == 1:
        return AdapterChoice(name, versions[0], STABLE)
    if versions:
        raise UnknownModel(f"adapter {name!r} is loaded in versions {', '.join(versions)} without a rollout; "
                           f"name one as {name}@VERSION")
    raise UnknownModel(f"the model {model!r} does not exist")


def canary_outcome(group: str, status: int) -> bool | None:
    """How a request to an adapter version counts in that version's statistics: None, not at
    all (a pinned version is the client's choice, not the split's; a 503 is the fleet's capacity
    or an adapter still loading; a 4xx or 499 is the client's); else whether it failed."""
    if group == PINNED or not (status == 200 or status >= 500) or status == 503:
        return None
    return status >= 500
