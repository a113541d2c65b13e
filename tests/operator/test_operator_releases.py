"""Two releases in one cluster: each release's operator handles only the EnginePools
labelled with its release, reads its own Redis, hands its engines its own Redis Secret, and
takes turns only with its own replicas (a peering record per release). An operator told a
namespace watches only that one. Against kmock's Kubernetes emulator and a real Redis."""

import kmock
import pytest

from tests.helpers.operator_harness import (  # noqa: F401  (fixtures)
    DEPLOYMENTS,
    H100,
    NS,
    POOLS,
    cluster,
    create_peering,
    create_pool,
    operator_config,
    peers,
    replicas,
    running_operator,
    set_qps,
    stored,
    wait_for,
)
from tests.helpers.redis_server import redis_server  # noqa: F401  (fixture)

pytestmark = [pytest.mark.asyncio, pytest.mark.kmock(cls=kmock.KubernetesEmulator)]


def engine(cluster, pool: str, ns: str = NS) -> dict:
    return stored(cluster, DEPLOYMENTS, f"{pool}-engine", ns)["spec"]["template"]["spec"]["containers"][0]


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def redis_db(redis_url: str, db: int) -> str:
    return redis_url.rsplit("/", 1)[0] + f"/{db}"


async def test_each_releases_operator_builds_and_scales_only_its_own_pools(cluster, redis_server):
    blue = operator_config(redis_db(redis_server, 1), release="blue", redis_secret="blue-k25-redis")
    green = operator_config(redis_db(redis_server, 2), release="green", redis_secret="green-k25-redis")
    set_qps(blue.redis_url, blue, "a", 400)
    set_qps(green.redis_url, green, "b", 160)
    set_qps(blue.redis_url, blue, "b", 800)  # in blue's Redis: not green's business
    for release in ("blue", "green"):
        await create_peering(cluster, release)
    async with running_operator(cluster, blue, priority=100), running_operator(cluster, green, priority=100):
        await create_pool(cluster, "stray", H100, release=None)
        await create_pool(cluster, "a", H100, release="blue")
        await create_pool(cluster, "b", H100, release="green")
        await wait_for(lambda: replicas(cluster, "a") == 5, "blue scales its pool for the QPS in its Redis")
        await wait_for(lambda: replicas(cluster, "b") == 2, "green scales its pool for the QPS in its Redis")
        await wait_for(lambda: (stored(cluster, POOLS, "b").get("status") or {}).get("observedQPS") == 160,
                       "green reports the QPS of its own Redis")
        # each works: a peering record per release, not one that makes the other release's operator stand by
        assert (peers(cluster, "blue"), peers(cluster, "green")) == (1, 1)

    for pool, release in (("a", "blue"), ("b", "green")):
        args, env = engine(cluster, pool)["args"], engine(cluster, pool)["env"]
        assert flag(args, "--release") == release
        assert {"name": "K25_REDIS_URL", "valueFrom": {"secretKeyRef": {
            "name": f"{release}-k25-redis", "key": "redis-url"}}} in env
        assert not [a for a in args if "redis" in a]
    stray = stored(cluster, POOLS, "stray")
    assert stored(cluster, DEPLOYMENTS, "stray-engine") is None
    assert "status" not in stray and not stray["metadata"].get("finalizers")


async def test_an_operator_told_its_namespace_watches_only_that_one(cluster, redis_server):
    config = operator_config(redis_server)
    await create_peering(cluster, config.release, namespace=NS)
    async with running_operator(cluster, config, namespaces=(NS,), priority=100):
        await create_pool(cluster, "there", H100, namespace="elsewhere")
        await create_pool(cluster, "here", H100)
        await wait_for(lambda: replicas(cluster, "here") == 1, "the pool in its namespace gets its engines")
        await wait_for(lambda: peers(cluster, config.release, namespace=NS) == 1,
                       "it keeps its peering record in that namespace")
    assert stored(cluster, DEPLOYMENTS, "there-engine", "elsewhere") is None
    assert "status" not in stored(cluster, POOLS, "there", "elsewhere")
