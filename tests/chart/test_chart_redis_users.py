"""A Redis user per part, with least privilege, in the chart's own Redis: the rendered Redis pod's
script runs the real `redis-server` with the rendered users, and each part, connecting with the
URL of its own rendered Secret, does through the project's own Redis functions everything it
does in a release, while what belongs to another part is refused with NOPERM: an engine cannot
write the QPS buckets that scale pools, the adapter statistics that decide canaries or the
rollout state; the operator cannot write what gateways count nor read stored documents; the
gateway cannot write rollout state. Each Deployment reads its own user's Secret."""

import pytest
import redis

from common.redis_keys import live_engines, pool_qps, record_requests, register_engine, unregister_engine
from common.adapter_stats import record_version_outcomes, version_stats
from common.rollout_keys import (
    RolloutState,
    claim_rollout,
    read_each_rollout,
    read_rollout,
    release_rollout,
    rollout_channel,
    write_rollout,
)
from services.gateway.document_store import DocumentStore, StoreLimits
from services.gateway.shared_limits import TenantState, exchange
from tests.helpers.chart_redis import part_url, started
from tests.helpers.helm_chart import (
    VALUE_SETS,
    engine_deployments,
    named,
    operator_env,
    rendered,
    rendered_with,
    secret_values,
    value_set_id,
)

R = "k25"  # the release: every key starts with it
SHA = "a" * 64
STATE = RolloutState(stable_version="v1", stable_source="ad/v1", stable_sha256=SHA)
ENTRY = {"address": "10.0.0.1:5555", "pool": "cpu", "chunk_size": 64}
NOPERM = pytest.raises(redis.exceptions.NoPermissionError)


@pytest.fixture(scope="module")
def objects():
    return rendered(None)


@pytest.fixture(scope="module")
def clients(objects, tmp_path_factory):
    """A client per part, each with its own Secret's URL, and the default user's (admin)."""
    folder = tmp_path_factory.mktemp("chart-redis")
    with started(objects, folder) as port:
        made = {part: redis.Redis.from_url(part_url(objects, f"k25-redis-{part}", port, folder))
                for part in ("gateway", "engine", "operator")}
        made["admin"] = redis.Redis.from_url(part_url(objects, "k25-redis", port, folder))
        yield made
        for client in made.values():
            client.close()


def test_each_part_authenticates_as_its_own_user(clients):
    for part in ("gateway", "engine", "operator"):
        assert clients[part].ping()
        with NOPERM:  # administration is not theirs
            clients[part].acl_list()
    admin = clients["admin"]
    assert {rule.split()[1] for rule in admin.acl_list()} == {"default", "gateway", "engine", "operator"}
    assert {c["user"] for c in admin.client_list()} == {"default", "gateway", "engine", "operator"}


def test_an_engine_registers_publishes_and_reads_rollouts_and_nothing_else(clients):
    engine, admin = clients["engine"], clients["admin"]
    write_rollout(clients["operator"], R, "ad", STATE)
    register_engine(engine, R, "e1", ENTRY, ttl_s=30)
    assert live_engines(clients["gateway"], R)["e1"]["pool"] == "cpu"
    assert engine.publish(f"{R}:kv_events", b"x") >= 0
    assert read_each_rollout(engine, R)[0]["ad"].stable_version == "v1"
    assert read_rollout(engine, R, "ad") is not None
    pubsub = engine.pubsub()
    pubsub.subscribe(rollout_channel(R))
    pubsub.close()
    unregister_engine(engine, R, "e1")
    # what scales pools, decides canaries and steers every engine is not an engine's to write
    for forged in (lambda pipe: record_requests(pipe, R, "cpu", 1_000.0, 10_000),
                   lambda pipe: record_version_outcomes(pipe, R, "ad", "v2", 1_000, 100, 0, [0.01] * 100)):
        pipe = engine.pipeline(transaction=False)
        forged(pipe)
        with NOPERM:
            pipe.execute()
    with NOPERM:
        write_rollout(engine, R, "ad", RolloutState(stable_version="evil", stable_source="x/evil", stable_sha256=SHA))
    with NOPERM:
        engine.set(f"{R}:qps:cpu:1000", 10_000)
    with NOPERM:
        engine.hset(f"{R}:rollout_adapters", "x", "y")
    with NOPERM:  # nor may it read tenants' documents, or another release's keys
        engine.hget(f"{R}:document:acme:doc-1", "text")
    with NOPERM:
        register_engine(engine, "other", "e1", ENTRY, ttl_s=30)
    assert admin.keys(f"{R}:qps:*") == [] and admin.keys(f"{R}:adapter_stats:*") == []
    assert read_rollout(admin, R, "ad").stable_version == "v1"


def test_a_gateway_counts_stores_documents_and_shares_limits_but_cannot_steer_rollouts(clients):
    gateway = clients["gateway"]
    pipe = gateway.pipeline(transaction=False)
    record_requests(pipe, R, "cpu", 2_000.0, 3)
    record_version_outcomes(pipe, R, "ad", "v1", 2_000, 3, 1, [0.1, 0.2, 0.3])
    pipe.execute()
    assert live_engines(gateway, R) == {}
    assert read_each_rollout(gateway, R)[1] == {}
    store = DocumentStore(gateway, R, StoreLimits(1 << 20, 1 << 20, 10, 60))
    store.put("acme", {"id": "doc-" + "0" * 24, "created": 1}, "text")
    assert store.load("acme", "doc-" + "0" * 24)[1] == "text"
    assert store.list("acme") and store.tenant_of("doc-" + "0" * 24) == "acme"
    assert store.delete("acme", "doc-" + "0" * 24)
    exchange(gateway, R, "g1", {"acme": TenantState(1.0, 0, None, 2_000.0)})
    pubsub = gateway.pubsub()
    pubsub.subscribe(f"{R}:kv_events")
    pubsub.close()
    with NOPERM:
        write_rollout(gateway, R, "ad", STATE)
    with NOPERM:
        claim_rollout(gateway, R, "ad", "me")
    with NOPERM:
        gateway.publish(rollout_channel(R), "ad")


def test_the_operator_reads_counts_and_steps_rollouts_but_cannot_forge_counts_or_read_documents(clients):
    operator, admin = clients["operator"], clients["admin"]
    pipe = admin.pipeline(transaction=False)
    record_requests(pipe, R, "cpu", 3_000.0, 5)
    record_version_outcomes(pipe, R, "ad", "v1", 3_000, 5, 0, [0.1] * 5)
    pipe.execute()
    assert pool_qps(operator, R, "cpu", 3_001.5, window_s=2).qps is not None
    assert version_stats(operator, R, "ad", "v1", 3_001.5, 2).requests == 5
    assert live_engines(operator, R) == {}
    assert claim_rollout(operator, R, "ad2", "owner") == "owner"
    write_rollout(operator, R, "ad2", STATE)
    assert read_rollout(operator, R, "ad2").stable_version == "v1"
    assert release_rollout(operator, R, "ad2", "owner") == 1
    pipe = operator.pipeline(transaction=False)
    record_requests(pipe, R, "cpu", 3_001.0, 10_000)
    with NOPERM:
        pipe.execute()
    with NOPERM:
        operator.hincrby(f"{R}:adapter_stats:ad@v1:3000", "errors", 100)
    with NOPERM:
        operator.hgetall(f"{R}:document:acme:doc-1")


def test_a_wrong_password_is_refused(objects, clients):
    url = clients["engine"].connection_pool.connection_kwargs
    intruder = redis.Redis(host=url["host"], port=url["port"], username="engine", password="guessed")
    with pytest.raises(redis.exceptions.AuthenticationError):
        intruder.ping()
    intruder.close()


@pytest.mark.parametrize("values", VALUE_SETS, ids=value_set_id)
def test_each_deployment_reads_its_own_users_secret(values):
    objects = rendered(values)
    bundled = any(o["kind"] == "StatefulSet" for o in objects)
    expected = {"gateway": "k25-redis-gateway", "operator": "k25-redis-operator"} if bundled else None
    for part in ("gateway", "operator"):
        [env] = [e for e in named(objects, "Deployment", f"k25-{part}")["spec"]["template"]["spec"]["containers"][0]["env"]
                 if e["name"] == "K25_REDIS_URL"]
        name = env["valueFrom"]["secretKeyRef"]["name"]
        assert name == expected[part] if bundled else not name.startswith("k25-redis-"), (part, name)
    engine_secret = operator_env(objects)["K25_REDIS_SECRET"]
    assert engine_secret == "k25-redis-engine" if bundled else not engine_secret.startswith("k25-redis-")
    for deployment in engine_deployments(objects):
        [env] = [e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"] if e["name"] == "K25_REDIS_URL"]
        assert env["valueFrom"]["secretKeyRef"]["name"] == engine_secret
    if bundled:
        secrets = secret_values(objects)
        passwords = {secrets[f"k25-redis-{p}"]["redis-password"] for p in ("gateway", "engine", "operator")}
        assert len(passwords) == 3 and secrets["k25-redis"]["redis-password"] not in passwords


def test_off_every_part_uses_the_releases_one_secret_and_redis_has_no_users(tmp_path):
    objects = rendered_with("redis: {users: {enabled: false}}", tmp_path)
    assert operator_env(objects)["K25_REDIS_SECRET"] == "k25-redis"
    assert not [o for o in objects if o["metadata"]["name"].startswith("k25-redis-")]
    assert "user " not in named(objects, "StatefulSet", "k25-redis")["spec"]["template"]["spec"]["containers"][0]["args"][2]


def test_under_generated_secrets_job_no_password_is_rendered_and_the_job_makes_each_users(tmp_path):
    first, second = (rendered_with("generatedSecrets: job", tmp_path) for _ in range(2))
    assert first == second  # GitOps: every render the same
    assert not [name for name in secret_values(first) if name.startswith("k25-redis")]
    [job] = [o for o in first if o["kind"] == "Job"]
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    for part in ("gateway", "engine", "operator"):
        assert f"{part}=k25-redis-{part}" in args
