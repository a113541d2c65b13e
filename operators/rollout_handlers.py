"""The kopf handlers for AdapterRollouts: thin glue between Redis, the pure step
(`rollout_policy.decide_step`) and the resource's status.

- a timer: read the canary's outcomes over the last interval and the engine registry from
  Redis, decide, write the Redis rollout state when it changed (which announces it to
  engines and gateways), report status and conditions. It writes nothing before kopf
  has put its finalizer on the rollout: state written for a rollout deleted in that
  moment would never be removed, since the deletion would not wait for the handler;
- delete: remove the adapter's rollout state, so that engines unload it and gateways stop
  offering it. An AdapterRollout is the declaration that its adapter is served.

One AdapterRollout owns an adapter's state: the first to claim it in Redis. Another one for the
same adapter says so in its status (phase Conflict) and writes nothing, and its deletion
leaves the owner's state alone; once the owner is deleted, the next tick of the other claims it.
"""

import time

import kopf
import redis

from common.rollout_keys import NAME_PATTERN, claim_rollout, release_rollout, versioned_name
from operators.config import FINALIZER, RELEASE_LABEL, OperatorConfig
from operators.rollout_spec import RolloutSpecError, parse_rollout_spec
from operators.rollout_status import (
    conflict_status,
    invalid_spec_status,
    redis_unavailable_status,
    status_from_dict,
    status_to_dict,
)
from operators.rollout_step import describe_state, run_step

ADAPTER_ROLLOUTS = ("k25.io", "v1alpha1", "adapterrollouts")


def register(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    on = dict(registry=registry, labels={RELEASE_LABEL: config.release})  # the rollouts of its own release

    @kopf.timer(*ADAPTER_ROLLOUTS, interval=config.interval_s, **on)
    def step_rollout(spec, status, meta, name, namespace, uid, memo, patch, logger, **_):
        if FINALIZER not in meta.get("finalizers", []):
            return  # the next tick, once a deletion is sure to reach remove_rollout_state
        previous = status.get("conditions", [])
        now = time.time()
        try:
            rollout = parse_rollout_spec(dict(spec))
        except RolloutSpecError as error:
            patch.status.update(invalid_spec_status(str(error), previous, now))
            return
        try:
            owner = claim_rollout(memo.redis, config.release, rollout.adapter, _owner(namespace, name, uid))
            if owner != _owner(namespace, name, uid):
                patch.status.update(conflict_status(owner, previous, now))
                return
            outcome = run_step(memo.redis, config.release, rollout, status_from_dict(dict(status)), now)
        except redis.RedisError as error:
            patch.status.update(redis_unavailable_status(str(error) or type(error).__name__, previous, now))
            return
        result = outcome.result
        if outcome.generation is not None:
            logger.info(f"{rollout.adapter}: {describe_state(outcome.generation, result.state)}")
        if result.status.reason != status.get("reason") or result.status.weight != status.get("weight"):
            logger.info(f"{name}: {result.status.message}")
        patch.status.update(status_to_dict(result.status, rollout.pool,
                                           versioned_name(rollout.adapter, rollout.canary.version),
                                           outcome.readiness, previous, now))

    @kopf.on.delete(*ADAPTER_ROLLOUTS, **on)
    def remove_rollout_state(spec, name, namespace, uid, memo, logger, **_):
        adapter = spec.get("adapter")
        if not isinstance(adapter, str) or not NAME_PATTERN.fullmatch(adapter):
            return  # no adapter, no state
        released = release_rollout(memo.redis, config.release, adapter, _owner(namespace, name, uid))
        if released == 1:
            logger.info(f"removed the rollout state of {adapter}")
        elif released == -1:
            logger.info(f"left the rollout state of {adapter} to the AdapterRollout that owns it")


def _owner(namespace: str, name: str, uid: str) -> str:
    return f"{namespace}/{name}/{uid}"

