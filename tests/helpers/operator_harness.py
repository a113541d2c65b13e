"""The operator against kmock's Kubernetes emulator and a real Redis: the fixtures and
helpers that the operator's end-to-end test modules share.

A module that uses them marks itself `pytest.mark.kmock(cls=kmock.KubernetesEmulator)` and
imports `cluster`, `operator` (and `redis_server`, which `operator` needs) by name.
"""

import asyncio
import contextlib
import threading
import time

import kopf
import kubernetes
import pytest
import pytest_asyncio

from operators.config import OperatorConfig
from operators.kube import KubeApi
from operators.runtime import build_registry, operator_memo, operator_settings

NS = "serving"
POOLS = "k25.io/v1alpha1/enginepools"
DEPLOYMENTS = "apps/v1/deployments"
ROLLOUTS = "k25.io/v1alpha1/adapterrollouts"
WAIT_S = 20.0  # generous: the assertions are about what happens, not how fast


@pytest.fixture
def cluster(kmock):
    info = kmock.ResourceInfo
    kmock.resources[POOLS] = info(kind="EnginePool", namespaced=True, subresources={"status", "scale"},
                                  verbs={"list", "watch", "get", "patch", "create", "delete"})
    kmock.resources[DEPLOYMENTS] = info(kind="Deployment", namespaced=True, subresources={"status", "scale"})
    kmock.resources[ROLLOUTS] = info(kind="AdapterRollout", namespaced=True, subresources={"status"},
                                     verbs={"list", "watch", "get", "patch", "create", "delete"})
    kmock.resources["v1/pods"] = info(kind="Pod", namespaced=True)
    kmock.resources["v1/namespaces"] = info(kind="Namespace", namespaced=False)  # kopf waits to discover it
    return kmock


@contextlib.asynccontextmanager
async def running_operator(cluster, config: OperatorConfig):
    """The operator in its own thread and event loop, as in production: kopf cancels the
    tasks that its loop started, which must not be the test's."""
    registry = build_registry(config)
    url = str(cluster.url).rstrip("/")

    @kopf.on.login(registry=registry)
    def login(**_):
        return kopf.ConnectionInfo(server=url)

    settings = operator_settings()
    settings.posting.enabled = False
    stop = threading.Event()
    kube = KubeApi(kubernetes.client.Configuration(host=url))
    thread = threading.Thread(target=asyncio.run, args=(kopf.operator(
        registry=registry, settings=settings, memo=operator_memo(config, kube),
        clusterwide=True, standalone=True, stop_flag=stop),))
    thread.start()
    try:
        yield config
    finally:
        stop.set()
        while thread.is_alive():  # the emulator in this loop must keep answering while kopf stops
            await asyncio.sleep(0.05)
        kube.close()


@pytest_asyncio.fixture
async def operator(cluster, redis_server):
    async with running_operator(cluster, OperatorConfig(release="test", redis_url=redis_server, interval_s=0.2,
                                                        qps_window_s=2)) as config:
        yield config


async def wait_for(check, what: str):
    deadline = time.monotonic() + WAIT_S
    while not (result := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"never happened: {what}")
        await asyncio.sleep(0.05)
    return result


def stored(cluster, resource: str, name: str, ns: str | None = NS) -> dict | None:
    try:
        found = cluster.objects[resource, ns, name]
    except KeyError:
        return None
    return None if found.deleted else found.raw
