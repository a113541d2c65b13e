"""Starting the operator: kopf with our handlers, a Kubernetes client and a Redis client.

Two replicas never fight: kopf peering lets only the live operator with the highest
priority work while the others stand by; each replica draws a random priority unless
told one, so two never tie (a tie would pause both)."""

import logging
import random

import kopf
import redis

from operators import handlers, rollout_handlers
from operators.config import FINALIZER, OperatorConfig
from operators.kube import KubeApi

PEERING_NAME = "k25-operator"


def operator_settings(settings: kopf.OperatorSettings | None = None) -> kopf.OperatorSettings:
    settings = settings or kopf.OperatorSettings()
    settings.posting.level = logging.WARNING  # Kubernetes events only for what needs a human
    # the timer and the delete handler make kopf keep a finalizer on each pool
    settings.persistence.finalizer = FINALIZER
    return settings


def operator_memo(config: OperatorConfig, kube: KubeApi | None = None) -> kopf.Memo:
    return kopf.Memo(kube=kube or KubeApi(), redis=redis.Redis.from_url(config.redis_url), history=())


def build_registry(config: OperatorConfig) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    handlers.register(registry, config)
    rollout_handlers.register(registry, config)
    return registry


def run_operator(config: OperatorConfig, namespaces: list[str], priority: int | None, standalone: bool) -> None:
    kopf.configure(verbose=False)
    kopf.run(
        registry=build_registry(config),
        settings=operator_settings(),
        memo=operator_memo(config),
        clusterwide=not namespaces,
        namespaces=namespaces,
        standalone=standalone,
        peering_name=None if standalone else PEERING_NAME,
        priority=priority if priority is not None else random.randint(1, 2**31 - 1),
    )
