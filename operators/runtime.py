"""Starting the operator: kopf with our handlers, a Kubernetes client and a Redis client.

Two replicas never fight: kopf peering lets only the live operator with the highest
priority work while the others stand by; each replica draws a random priority unless
told one, so two never tie (a tie would pause both). The peering record is the release's
own, so that the operators of two releases in one cluster both work.

Watching given namespaces (`k25 operator --namespace`) needs no cluster-wide permission:
kopf then discovers the resources once at start instead of watching the CRDs and namespaces,
and keeps its peering record in each namespace (a KopfPeering, not a ClusterKopfPeering)."""

import logging
import random

import kopf
import redis

from operators import handlers, rollout_handlers
from operators.config import FINALIZER, OperatorConfig
from operators.kube import KubeApi


def peering_name(release: str) -> str:
    return f"k25-operator-{release}"


def operator_settings(namespaced: bool = False) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.posting.level = logging.WARNING  # Kubernetes events only for what needs a human
    # the timer and the delete handler make kopf keep a finalizer on each pool
    settings.persistence.finalizer = FINALIZER
    settings.scanning.disabled = namespaced
    return settings


def operator_scope(config: OperatorConfig, namespaces: list[str], priority: int | None, standalone: bool) -> dict:
    """What kopf is told about where to watch and how to share the work, besides the registry."""
    return dict(clusterwide=not namespaces, namespaces=namespaces, standalone=standalone,
                peering_name=None if standalone else peering_name(config.release),
                priority=priority if priority is not None else random.randint(1, 2**31 - 1))


def operator_memo(config: OperatorConfig, kube: KubeApi | None = None) -> kopf.Memo:
    return kopf.Memo(kube=kube or KubeApi(), redis=redis.Redis.from_url(config.redis_url), history=())


def build_registry(config: OperatorConfig) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    handlers.register(registry, config)
    rollout_handlers.register(registry, config)
    return registry


def run_operator(config: OperatorConfig, namespaces: list[str], priority: int | None, standalone: bool) -> None:
    kopf.configure(verbose=False)
    kopf.run(registry=build_registry(config), settings=operator_settings(namespaced=bool(namespaces)),
             memo=operator_memo(config), **operator_scope(config, namespaces, priority, standalone))
