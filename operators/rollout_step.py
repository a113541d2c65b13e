"""One step of an adapter rollout against Redis, wherever it runs: the operator's timer for
an AdapterRollout, or `k25 rollout` on one machine. Reads the canary's outcomes and the
engine registry, takes the pure step, and writes the Redis rollout state when it changed
(which announces it to engines and gateways)."""

import dataclasses
from dataclasses import dataclass

from common.adapter_stats import version_stats
from common.redis_keys import live_engines
from common.rollout_keys import RolloutStateError, read_rollout, write_rollout
from operators.rollout_policy import Readiness, RolloutStatus, StepResult, decide_step, readiness, recovered_status
from operators.rollout_spec import RolloutSpec


@dataclass(frozen=True)
class StepOutcome:
    result: StepResult
    readiness: Readiness  # of the canary on the pool's engines
    generation: int | None  # of the state written; None when the stored one was already right


def run_step(client, release: str, rollout: RolloutSpec, status: RolloutStatus | None, now: float) -> StepOutcome:
    """Raises what Redis raises; nothing is written then. Without a status of its own the rollout
    goes on from the adapter's Redis state when this spec wrote it (`recovered_status`): a lost
    status must not send users back to a version the rollout had left."""
    stored = _stored_state(client, release, rollout.adapter)
    if status is None:
        status = recovered_status(rollout, stored, now)
    canary = rollout.canary.version
    stats, stable = (version_stats(client, release, rollout.adapter, version, now, rollout.interval_s,
                                   rollout.max_requests_per_tenant) for version in (canary, rollout.stable.version))
    ready = readiness(live_engines(client, release), rollout.pool, rollout.adapter, canary)
    result = decide_step(rollout, status, stats, ready.ready, now,
                         loaded_nowhere=ready.engines > 0 and len(ready.missing) == ready.engines, stable=stable)
    generation = None
    if stored != result.state:
        generation = write_rollout(client, release, rollout.adapter, result.state)
    return StepOutcome(result, ready, generation)


def describe_state(generation: int, state) -> str:
    on_trial = f"{state.canary_version} canary at {state.canary_weight}%" if state.has_canary else "no canary"
    return f"rollout state {generation}: {state.stable_version} stable, {on_trial} ({state.phase})"


def _stored_state(client, release: str, adapter: str):
    """What the Redis hash holds, without its generation; None for nothing or a hash that
    breaks the contract (both get overwritten)."""
    try:
        stored = read_rollout(client, release, adapter)
    except RolloutStateError:
        return None
    return None if stored is None else dataclasses.replace(stored, generation=0)
