"""The kopf handlers: thin glue between Kubernetes events and the pure functions.

- create/resume/update: keep the pool's workload as its spec says (the replica count stays
  the autoscaler's): a Deployment, or for a pool over several nodes a LeaderWorkerSet
  (operators/workload.py). A pool whose nodesPerReplica crosses 1 gets the other kind, and the
  old one is deleted once no other pool of the release is rolling;
- `kubectl scale enginepool`: set the size now, the autoscaler goes on from it;
- a timer: read QPS from Redis (and, for the predictive policy, the QPS series, the
  engines' queues and the pods' start-up times), decide, scale through the workload's
  scale subresource, report status, conditions and the forecast.
- delete: remove the workload. The owner reference makes Kubernetes' garbage collector
  do the same, also when the operator is down; kopf's timer puts a finalizer on each pool
  anyway, so deleting explicitly costs nothing and does not depend on the collector.

The handlers see only the pools labelled with the operator's release, and change or delete
only a workload the pool owns (operators.deployment.owned_by). A foreign one of the pool's
name is left untouched: the pool reports it in its conditions, and the operator looks again
every `foreign_recheck_s` to create the pool's own once it has gone.
"""

import dataclasses
import datetime
import time

import kopf
import redis

from common.redis_keys import QpsReading, pool_qps
from operators.autoscale_policy import PoolObservation, decide
from operators.config import RELEASE_LABEL, OperatorConfig
from operators.deployment import owned_by, pod_selector, workload_name
from operators.image_policy import image_refusal
from operators.kube import ApiMissing
from operators.pool_signals import engine_signals, pod_signals, qps_series
from operators.pool_spec import PoolSpecError, parse_pool_spec
from operators.pool_status import LWS_MISSING, build_status, foreign_workload_status, pool_pods
from operators.pool_upgrade import TEMPLATE_HASH, rolling_elsewhere
from operators.predictive_policy import decide_predictive
from operators.workload import KINDS, build_workload, workload_kind, workload_patch

ENGINE_POOLS = ("k25.io", "v1alpha1", "enginepools")


def register(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    on = dict(registry=registry, labels={RELEASE_LABEL: config.release})

    @kopf.on.create(*ENGINE_POOLS, **on)
    @kopf.on.resume(*ENGINE_POOLS, **on)
    @kopf.on.update(*ENGINE_POOLS, field="spec", **on)
    def reconcile_workload(body, spec, name, namespace, uid, status, memo, patch, logger, **_):
        pool_spec = _parse_or_report(spec, status, patch, config)
        kind, engines = workload_kind(pool_spec), workload_name(name)
        existing = memo.kube.get_workload(kind, namespace, engines)
        if existing is not None and not owned_by(existing, uid):
            patch.status.update(foreign_workload_status(name, kind.kind, status.get("conditions", []), _now_iso()))
            raise kopf.TemporaryError(f"{kind.kind} {engines} is not owned by this pool; left untouched",
                                      delay=config.foreign_recheck_s)
        # a pool whose nodesPerReplica crossed 1 has its engines in the other kind of workload
        replaced = [other for other in KINDS if other is not kind
                    and owned_by(memo.kube.get_workload(other, namespace, engines) or {}, uid)]
        replicas = pool_spec.initial_replicas() if existing is None else existing.get("spec", {}).get("replicas") or 0
        bounded = min(max(replicas, pool_spec.min_replicas), pool_spec.max_replicas)
        manifest = build_workload(body, pool_spec, bounded, config)
        annotations = manifest["metadata"]["annotations"]
        if replaced or (existing is not None and
                        (existing.get("metadata", {}).get("annotations") or {}).get(TEMPLATE_HASH) != annotations[TEMPLATE_HASH]):
            # new templates restart the pool's engines: one pool of the release at a time
            selector = f"app.kubernetes.io/instance={config.release},app.kubernetes.io/component=engine"
            release_pools = [w for k in KINDS for w in memo.kube.list_workloads(k, namespace, selector)]
            rolling = rolling_elsewhere(release_pools, engines)
            if rolling is not None:
                raise kopf.TemporaryError(f"waiting for {rolling} to finish rolling out before this pool's "
                                          "engines restart", delay=config.interval_s)
        if existing is None:
            try:
                memo.kube.create_workload(kind, namespace, manifest)
            except ApiMissing as error:  # the old kind, if any, keeps serving
                raise kopf.TemporaryError(f"{error}: {LWS_MISSING}", delay=config.foreign_recheck_s) from error
            logger.info(f"created {kind.kind} {engines} with {bounded} replicas")
        else:
            memo.kube.patch_workload(kind, namespace, engines, workload_patch(manifest, bounded))
        for other in replaced:
            memo.kube.delete_workload(other, namespace, engines)
            logger.info(f"deleted {other.kind} {engines}: the pool's engines are now a {kind.kind}'s")

    @kopf.on.update(*ENGINE_POOLS, field="spec.replicas", **on)
    def scale_by_hand(new, spec, name, namespace, uid, status, memo, patch, logger, **_):
        if new is None:
            return
        pool_spec = _parse_or_report(spec, status, patch, config)
        kind, engines = workload_kind(pool_spec), workload_name(name)
        existing = memo.kube.get_workload(kind, namespace, engines)
        if existing is not None and not owned_by(existing, uid):
            logger.warning(f"not scaled: {kind.kind} {engines} is not owned by this pool")
            return
        replicas = pool_spec.initial_replicas()
        memo.kube.scale_workload(kind, namespace, engines, replicas)
        memo.history = ()  # the autoscaler starts over from this size, a full window before going down
        logger.info(f"scaled by hand to {replicas} replicas")

    @kopf.on.delete(*ENGINE_POOLS, **on)
    def delete_workload(name, namespace, uid, memo, logger, **_):
        engines = workload_name(name)
        for kind in KINDS:
            existing = memo.kube.get_workload(kind, namespace, engines)
            if existing is None:
                continue
            if not owned_by(existing, uid):
                logger.info(f"left {kind.kind} {engines} in place: this pool does not own it")
            elif memo.kube.delete_workload(kind, namespace, engines):
                logger.info(f"deleted {kind.kind} {engines}")

    @kopf.timer(*ENGINE_POOLS, interval=config.interval_s, **on)
    def autoscale(spec, name, namespace, uid, status, memo, patch, logger, **_):
        try:
            pool_spec = _parse(spec, config)
        except PoolSpecError:
            return  # reconcile_workload has said why in the conditions
        kind = workload_kind(pool_spec)
        deployment = memo.kube.get_workload(kind, namespace, workload_name(name))
        if deployment is not None and not owned_by(deployment, uid):
            patch.status.update(foreign_workload_status(name, kind.kind, status.get("conditions", []), _now_iso()))
            return
        pods = memo.kube.list_pods(namespace, pod_selector(name))
        now = time.time()
        decision, reading = None, QpsReading(None, None)
        if deployment is not None:
            reading, redis_error = _read_qps(memo.redis, config, name, now)
            current = deployment.get("spec", {}).get("replicas") or 0
            ready = deployment.get("status", {}).get("readyReplicas") or 0
            seen = PoolObservation(now, current, min(ready, current), reading.qps, reading.newest_bucket_age_s)
            history = getattr(memo, "history", ())
            if pool_spec.autoscaling_policy == "predictive":
                signals = _read_signals(memo.redis, config, name, pool_pods(name, pods), now, pool_spec)
                decision = decide_predictive(pool_spec.scaling_rules(), pool_spec.predictive_rules(), seen, signals,
                                             history)
            else:
                decision = decide(pool_spec.scaling_rules(), seen, history)
            if redis_error:
                decision = dataclasses.replace(decision, message=f"cannot read QPS from Redis ({redis_error}); "
                                                                 f"holding the current size")
            memo.history = decision.history
            if decision.replicas != current:
                memo.kube.scale_workload(kind, namespace, workload_name(name), decision.replicas)
                logger.info(f"scaled {current} -> {decision.replicas}: {decision.reason}: {decision.message}")
        patch.status.update(build_status(name, kind.kind, deployment, pods, reading.qps, decision,
                                         status.get("conditions", []), _now_iso()))


def _parse(spec, config: OperatorConfig):
    pool_spec = parse_pool_spec(spec)
    refusal = image_refusal(pool_spec.image, config.allowed_images)
    if refusal is not None:
        raise PoolSpecError(refusal)
    return pool_spec


def _parse_or_report(spec, status, patch, config: OperatorConfig):
    try:
        return _parse(spec, config)
    except PoolSpecError as error:
        patch.status["conditions"] = [{"type": "Ready", "status": "False", "reason": "InvalidSpec",
                                       "message": str(error), "lastTransitionTime": _now_iso()}]
        raise kopf.PermanentError(str(error)) from error


def _read_qps(client, config: OperatorConfig, pool: str, now: float) -> tuple[QpsReading, str | None]:
    try:
        return pool_qps(client, config.release, pool, now, window_s=config.qps_window_s), None
    except redis.RedisError as error:
        return QpsReading(None, None), str(error) or type(error).__name__


def _read_signals(client, config: OperatorConfig, pool: str, pods: list[dict], now: float, pool_spec):
    """The pods' signals always; the series, the queues and the TTFT when Redis answers
    (without them the forecast is the observed QPS and the guards are off)."""
    signals = pod_signals(pods, now)
    try:
        series = qps_series(client, config.release, pool, now, pool_spec.predictive_rules().fit_window_s)
        waiting, ttft_p95_s = engine_signals(client, config.release, pool)
        return dataclasses.replace(signals, qps_series=series, waiting=waiting, ttft_p95_s=ttft_p95_s)
    except redis.RedisError:
        return signals


def _now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
