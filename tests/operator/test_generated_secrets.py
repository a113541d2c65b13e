"""`k25 secrets ensure` against kmock's Kubernetes emulator: a Secret that does not exist is made
with what the release reads from it, one that exists is kept byte for byte (so the credentials
stay what they were at install, however often the chart is rendered), and one that exists
without those keys is a clear error, never overwritten."""

import asyncio
import base64
import urllib.parse

import kmock
import kubernetes
import pytest

from common.zmq_curve import checked_secret_key
from operators.generated_secrets import SecretError, ensure_secret, redis_secret_data, transport_secret_data

pytestmark = [pytest.mark.asyncio, pytest.mark.kmock(cls=kmock.KubernetesEmulator)]
NS = "serving"
SECRETS = "v1/secrets"


@pytest.fixture
def core(kmock):
    kmock.resources[SECRETS] = kmock.ResourceInfo(kind="Secret", namespaced=True)
    configuration = kubernetes.client.Configuration(host=str(kmock.url).rstrip("/"))
    with kubernetes.client.ApiClient(configuration) as client:
        yield kubernetes.client.CoreV1Api(client)


def decoded(kmock, name: str) -> dict[str, str]:
    stored = kmock.objects[SECRETS, NS, name]
    return {key: base64.b64decode(value).decode() for key, value in stored["data"].items()}


async def test_absent_secrets_are_made_with_what_the_release_reads(kmock, core):
    made = await asyncio.gather(
        asyncio.to_thread(ensure_secret, core, NS, "k25-redis", lambda: redis_secret_data("k25-redis"), {"app": "k25"}),
        asyncio.to_thread(ensure_secret, core, NS, "k25-transport", transport_secret_data, {"app": "k25"}))
    assert made == [True, True]
    redis_data = decoded(kmock, "k25-redis")
    url = urllib.parse.urlsplit(redis_data["redis-url"])
    assert (url.password, url.hostname, url.port) == (redis_data["redis-password"], "k25-redis", 6379)
    assert len(redis_data["redis-password"]) >= 32
    key = decoded(kmock, "k25-transport")["curve-secret-key"]
    assert checked_secret_key(key) == key.encode()  # what every part checks at start


async def test_an_existing_secret_is_kept_as_it_was(kmock, core):
    await asyncio.to_thread(ensure_secret, core, NS, "k25-transport", transport_secret_data, {})
    before = decoded(kmock, "k25-transport")
    for _ in range(3):  # every upgrade, every GitOps sync
        assert await asyncio.to_thread(ensure_secret, core, NS, "k25-transport", transport_secret_data, {}) is False
    assert decoded(kmock, "k25-transport") == before


async def test_a_secret_without_the_keys_the_release_reads_is_an_error_and_left_alone(kmock, core):
    kmock.objects[SECRETS, NS, "k25-redis"] = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "k25-redis",
                                               "namespace": NS}, "data": {"other": "eA=="}}
    with pytest.raises(SecretError, match="exists without redis-password, redis-url"):
        await asyncio.to_thread(ensure_secret, core, NS, "k25-redis", lambda: redis_secret_data("h"), {})
    assert kmock.objects[SECRETS, NS, "k25-redis"]["data"] == {"other": "eA=="}


async def test_a_curve_rotation_steps_through_the_secret_in_the_cluster(kmock, core):
    from operators.curve_rotation import RotationError
    from operators.generated_secrets import rotate_transport_secret

    await asyncio.to_thread(ensure_secret, core, NS, "k25-transport", transport_secret_data, {})
    old = decoded(kmock, "k25-transport")["curve-secret-key"]
    await asyncio.to_thread(rotate_transport_secret, core, NS, "k25-transport", "add-next")
    new = decoded(kmock, "k25-transport")["curve-secret-key-next"]
    assert decoded(kmock, "k25-transport") == {"curve-secret-key": old, "curve-secret-key-next": new}
    assert checked_secret_key(new) == new.encode()
    with pytest.raises(RotationError, match="a rotation is under way"):  # a second add-next changes nothing
        await asyncio.to_thread(rotate_transport_secret, core, NS, "k25-transport", "add-next")
    await asyncio.to_thread(rotate_transport_secret, core, NS, "k25-transport", "promote")
    assert decoded(kmock, "k25-transport") == {"curve-secret-key": new, "curve-secret-key-previous": old}
    await asyncio.to_thread(rotate_transport_secret, core, NS, "k25-transport", "remove-old")
    assert decoded(kmock, "k25-transport") == {"curve-secret-key": new}


@pytest.mark.parametrize(("argv", "problem"), [
    (["--redis-user-secret", "engine=k25-redis-engine"], "need --redis-host"),
    (["--redis-user-secret", "engine", "--redis-host", "k25-redis"], "takes USER=NAME"),
    (["--redis-user-secret", "=k25-redis-engine", "--redis-host", "k25-redis"], "takes USER=NAME"),
])
async def test_ensure_refuses_a_user_secret_it_cannot_make(argv, problem, capsys):
    from k25.cli import build_parser

    args = build_parser().parse_args(["secrets", "ensure", "--namespace", NS, *argv])
    assert args.handler(args) == 2
    assert problem in capsys.readouterr().err


async def test_a_kept_redis_secret_keeps_its_password_and_its_url_follows_tls(kmock, core):
    from operators.generated_secrets import refresh_redis_url

    make = lambda: redis_secret_data("k25-redis", "engine")
    await asyncio.to_thread(ensure_secret, core, NS, "k25-redis-engine", make, {})
    before = decoded(kmock, "k25-redis-engine")
    assert not await asyncio.to_thread(refresh_redis_url, core, NS, "k25-redis-engine", "k25-redis", "engine", None)
    assert decoded(kmock, "k25-redis-engine") == before
    ca = "/etc/k25/redis-tls/ca.crt"
    assert await asyncio.to_thread(refresh_redis_url, core, NS, "k25-redis-engine", "k25-redis", "engine", ca)
    after = decoded(kmock, "k25-redis-engine")
    assert after == {"redis-password": before["redis-password"],
                     "redis-url": f"rediss://engine:{before['redis-password']}@k25-redis:6379/0?ssl_ca_certs={ca}"}
