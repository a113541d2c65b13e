"""Redis credentials: every component and engine reads the Redis URL, password included, from a
Secret (as K25_REDIS_URL), never from its command line or a plain value; the chart's own Redis
requires the password its clients are given (checked by running its start command on a real
redis-server); a password from values, a Secret of yours, or an external Redis's URL."""

import subprocess
import time

import pytest
import redis

from tests.helpers.helm_chart import (
    VALUE_SETS,
    engine_deployments,
    named,
    of_kind,
    operator_env,
    rendered,
    process_containers,
    rendered_with,
    secret_values,
    value_set_id,
)
from tests.helpers.redis_server import free_port

value_sets = pytest.mark.parametrize("values", VALUE_SETS, ids=value_set_id)
# the k25 processes that talk to Redis; the chunker does not
READERS = ("k25-gateway", "k25-operator")


def redis_readers(objects) -> dict[str, dict]:
    """The containers of every k25 process that talks to Redis, the engines the operator builds included."""
    return process_containers(objects, READERS)


def url_source(container: dict) -> dict | None:
    [entry] = [e for e in container.get("env", []) if e["name"] == "K25_REDIS_URL"] or [None]
    return entry and entry.get("valueFrom", {}).get("secretKeyRef")


@value_sets
def test_every_process_reads_the_redis_url_from_the_secret_and_no_pod_spec_holds_it(values):
    objects = rendered(values)
    secrets = secret_values(objects)
    readers = redis_readers(objects)
    secret = operator_env(objects)["K25_REDIS_SECRET"]  # which the operator hands to the engines
    # the chart's own Redis: each part its own user's Secret (test_chart_redis_users.py); else one for all
    own = {f"k25-{part}": f"k25-redis-{part}" for part in ("gateway", "operator")} if of_kind(objects, "StatefulSet") \
        else {}
    assert {name: url_source(c) for name, c in readers.items()} == {
        name: {"name": own.get(name, secret), "key": "redis-url"} for name in readers}
    for name, c in readers.items():
        assert not [a for a in c["args"] if "redis://" in a or "rediss://" in a or a == "--redis-url"], name
    # no URL nor password in any pod spec, as an argument or a plain value
    pods = str([o["spec"]["template"] for o in [*objects, *engine_deployments(objects)]
                if o["kind"] in ("Deployment", "StatefulSet")])
    for name in {secret, *own.values()}:
        for data in secrets.get(name, {}).values():
            assert data not in pods


def test_the_charts_redis_requires_the_password_its_clients_are_given(tmp_path):
    objects = rendered(None)
    credentials = secret_values(objects)["k25-redis"]
    password = credentials["redis-password"]
    assert len(password) >= 32 and credentials["redis-url"] == f"redis://:{password}@k25-redis:6379/0"
    [statefulset] = of_kind(objects, "StatefulSet")
    server = statefulset["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "REDISCLI_AUTH", "valueFrom": {"secretKeyRef": {"name": "k25-redis", "key": "redis-password"}}} \
        in server["env"]
    assert password not in str(statefulset)

    # the container's own start command, on this machine: its paths and port moved to ours
    port = free_port()
    script = (server["args"][2].replace("/tmp/", f"{tmp_path}/").replace("--dir /data", f"--dir {tmp_path}")
              + f" --port {port} --bind 127.0.0.1")
    process = subprocess.Popen(server["args"][:2] + [script], env={"REDISCLI_AUTH": password, "PATH": "/usr/bin:/bin"},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis.from_url(credentials["redis-url"].replace("k25-redis:6379", f"127.0.0.1:{port}"))
        deadline = time.monotonic() + 10
        while True:
            try:
                assert client.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline and process.poll() is None, "the chart's Redis did not start"
                time.sleep(0.05)
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).ping()
        # the probes: redis-cli reads the password from REDISCLI_AUTH
        cli, *command = server["livenessProbe"]["exec"]["command"]
        probe = [cli, "-p", str(port), *command]
        assert subprocess.run(probe, env={"REDISCLI_AUTH": password}, capture_output=True, text=True).stdout == "PONG\n"
        client.close()
    finally:
        process.kill()
        process.wait()


def test_a_password_from_values_is_the_redis_password_and_in_the_url(tmp_path):
    objects = rendered_with("redis:\n  auth:\n    password: s3cret.Pass-word_1~\n", tmp_path)
    assert secret_values(objects)["k25-redis"] == {"redis-password": "s3cret.Pass-word_1~",
                                                    "redis-url": "redis://:s3cret.Pass-word_1~@k25-redis:6379/0"}


def test_a_secret_of_yours_for_the_charts_redis(tmp_path):
    objects = rendered_with("redis:\n  auth:\n    existingSecret: my-redis\n", tmp_path)
    assert "k25-redis" not in secret_values(objects)
    # the parts connect as their own users; yours is the default user's (the probes')
    assert {url_source(c)["name"] for c in redis_readers(objects).values()} == {
        "k25-redis-gateway", "k25-redis-operator", "k25-redis-engine"}
    off = rendered_with("redis:\n  auth:\n    existingSecret: my-redis\n  users:\n    enabled: false\n", tmp_path)
    assert {url_source(c)["name"] for c in redis_readers(off).values()} == {"my-redis"}
    [statefulset] = of_kind(objects, "StatefulSet")
    env = statefulset["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "REDISCLI_AUTH", "valueFrom": {"secretKeyRef": {"name": "my-redis", "key": "redis-password"}}} in env


@pytest.mark.parametrize("external, secret", [
    ("url: rediss://:pw@redis.data:6380/0", "k25-redis"),  # TLS: the chart keeps the URL in its Secret
    ("existingSecret: redis-credentials", "redis-credentials"),
])
def test_an_external_redis_runs_no_redis_and_every_process_reads_its_secret(external, secret, tmp_path):
    objects = rendered_with(f"redis:\n  external:\n    {external}\n", tmp_path)
    assert not of_kind(objects, "StatefulSet")
    assert not [p for p in of_kind(objects, "NetworkPolicy") if p["metadata"]["name"].endswith("-redis")]
    assert {url_source(c)["name"] for c in redis_readers(objects).values()} == {secret}
    operator = named(objects, "Deployment", "k25-operator")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "K25_REDIS_SECRET", "value": secret} in operator["env"]  # the engines' Secret
    if secret == "k25-redis":
        assert secret_values(objects)[secret] == {"redis-url": "rediss://:pw@redis.data:6380/0"}
    else:
        assert secret_values(objects).keys() == {"k25-transport"}  # no Redis Secret of the chart's
