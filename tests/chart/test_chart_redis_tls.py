"""TLS for the chart's own Redis (redis.tls): the rendered Redis pod's script runs the real
`redis-server` on a TLS-only port with a certificate made here, every part connects with the
rediss:// URL of its own rendered Secret and checks that certificate against the CA the chart
mounts for it, and a plain or an unchecked connection gets nowhere. Off by default."""

import subprocess

import pytest
import redis

from common.redis_keys import live_engines
from tests.helpers.chart_redis import part_url, redis_container, started
from tests.helpers.helm_chart import (
    engine_deployments,
    named,
    operator_env,
    render_error,
    rendered,
    rendered_with,
    secret_values,
)

TLS = "redis: {tls: {enabled: true, existingSecret: redis-cert}}\n"
CA_DIR = "/etc/k25/redis-tls"


def openssl(*args: str, cwd) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory) -> dict[str, bytes]:
    """What cert-manager would put in the Secret: a CA, and a certificate it signed for the Service
    (and for 127.0.0.1, where the test's Redis listens)."""
    folder = tmp_path_factory.mktemp("certs")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=k25 test CA",
            "-keyout", "ca.key", "-out", "ca.crt", cwd=folder)
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=k25-redis", "-keyout", "tls.key", "-out", "tls.csr",
            cwd=folder)
    (folder / "san.ext").write_text("subjectAltName=DNS:k25-redis,IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "1",
            "-extfile", "san.ext", "-out", "tls.crt", cwd=folder)
    return {name: (folder / name).read_bytes() for name in ("tls.crt", "tls.key", "ca.crt")}


def test_every_part_reaches_the_charts_redis_over_tls_as_its_own_user(certificates, tmp_path):
    objects = rendered_with(TLS, tmp_path)
    with started(objects, tmp_path, certificates) as port:
        for secret in ("k25-redis", "k25-redis-gateway", "k25-redis-engine", "k25-redis-operator"):
            url = part_url(objects, secret, port, tmp_path)
            assert url.startswith("rediss://")
            client = redis.Redis.from_url(url)
            assert client.ping()
            client.close()
        gateway = redis.Redis.from_url(part_url(objects, "k25-redis-gateway", port, tmp_path))
        assert live_engines(gateway, "k25") == {}
        gateway.close()
        plain = redis.Redis(host="127.0.0.1", port=port, password=secret_values(objects)["k25-redis"]["redis-password"],
                            socket_timeout=5)
        with pytest.raises(redis.ConnectionError):  # the one port speaks TLS only
            plain.ping()
        plain.close()
        (tmp_path / "other-ca.crt").write_bytes(certificates["tls.crt"])  # a CA that did not sign it
        unchecked = redis.Redis(host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(tmp_path / "other-ca.crt"), socket_timeout=5)
        with pytest.raises(redis.ConnectionError):
            unchecked.ping()
        unchecked.close()


def ca_mounts(pod_spec: dict) -> list:
    volumes = [v for v in pod_spec.get("volumes", []) if v["name"] == "redis-tls"]
    mounts = [m for m in pod_spec["containers"][0].get("volumeMounts", []) if m["name"] == "redis-tls"]
    return volumes + mounts


def test_every_part_that_reads_redis_mounts_only_the_ca(tmp_path):
    objects = rendered_with(TLS, tmp_path)
    assert operator_env(objects)["K25_REDIS_CA_SECRET"] == "redis-cert"
    pods = {name: named(objects, "Deployment", name)["spec"]["template"]["spec"] for name in ("k25-gateway", "k25-operator")}
    pods |= {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in engine_deployments(objects)}
    assert len(pods) > 2
    for name, pod in pods.items():
        assert ca_mounts(pod) == [
            {"name": "redis-tls", "secret": {"secretName": "redis-cert", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"name": "redis-tls", "mountPath": CA_DIR, "readOnly": True}], name
    redis_pod = named(objects, "StatefulSet", "k25-redis")["spec"]["template"]["spec"]
    assert {"name": "tls", "secret": {"secretName": "redis-cert"}} in redis_pod["volumes"]
    assert redis_container(objects)["livenessProbe"]["exec"]["command"] == [
        "redis-cli", "--tls", "--cacert", f"{CA_DIR}/ca.crt", "ping"]


def test_off_by_default_nothing_speaks_or_mounts_tls():
    objects = rendered(None)
    assert all(url["redis-url"].startswith("redis://") for name, url in secret_values(objects).items()
               if name.startswith("k25-redis"))
    assert "tls" not in redis_container(objects)["args"][2]
    assert not [d for d in [*of_deployments(objects), *engine_deployments(objects)] if ca_mounts(d["spec"]["template"]["spec"])]


def of_deployments(objects) -> list[dict]:
    return [o for o in objects if o["kind"] == "Deployment"]


def test_under_generated_secrets_job_the_job_writes_tls_urls(tmp_path):
    objects = rendered_with(TLS + "generatedSecrets: job\n", tmp_path)
    [job] = [o for o in objects if o["kind"] == "Job"]
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--redis-ca") + 1] == f"{CA_DIR}/ca.crt"


def test_the_job_makes_the_same_urls_the_chart_renders():
    from operators.generated_secrets import redis_secret_data

    made = redis_secret_data("k25-redis", "engine", f"{CA_DIR}/ca.crt")
    assert made["redis-url"] == f"rediss://engine:{made['redis-password']}@k25-redis:6379/0?ssl_ca_certs={CA_DIR}/ca.crt"
    plain = redis_secret_data("k25-redis")
    assert plain["redis-url"] == f"redis://:{plain['redis-password']}@k25-redis:6379/0"


@pytest.mark.parametrize("values, message", [
    ("redis: {tls: {enabled: true}}\n", "redis.tls.enabled needs redis.tls.existingSecret"),
    ("redis: {external: {url: 'rediss://r:6379/0'}, tls: {enabled: true, existingSecret: c}}\n",
     "for a Redis of your own give a rediss:// URL"),
])
def test_incomplete_tls_values_are_refused(values, message, tmp_path):
    assert message in render_error(values, tmp_path)
