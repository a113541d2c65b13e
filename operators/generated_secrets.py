"""The release's generated credentials, made inside the cluster once and never rendered by Helm.

Helm's `lookup` cannot see the cluster under `helm template`, which is how Argo CD and Flux
render a chart: there every render would make new random credentials while running pods keep
the old ones. With `generatedSecrets: job` the chart renders only the Secrets' names, and a
hook Job runs `k25 secrets ensure`, which creates each Secret that does not exist yet and leaves
one that does exactly as it is: every render of the chart is the same, and the credentials stay
what they were at install."""

import base64
import secrets

import kubernetes

from common.zmq_curve import new_secret_key
from operators.config import CURVE_SECRET_KEY_KEY, REDIS_URL_KEY
from operators.curve_rotation import rotation_step

REDIS_PASSWORD_KEY = "redis-password"
PASSWORD_CHARS = 32


class SecretError(Exception):
    """A Secret exists under the name but lacks what the release reads from it."""


def redis_secret_data(redis_host: str, user: str = "", ca_file: str | None = None) -> dict[str, str]:
    """A new password and the URL a part reads (letters and digits: safe in a URL as they are), for
    `user` (the default user when empty); with `ca_file`, a TLS URL that checks Redis' certificate
    against that CA (the chart's k25.bundledRedisUrl makes the same)."""
    password = "".join(secrets.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
                       for _ in range(PASSWORD_CHARS))
    return {REDIS_PASSWORD_KEY: password, REDIS_URL_KEY: redis_url(redis_host, user, password, ca_file)}


def redis_url(redis_host: str, user: str, password: str, ca_file: str | None) -> str:
    scheme, query = ("rediss", f"?ssl_ca_certs={ca_file}") if ca_file else ("redis", "")
    return f"{scheme}://{user}:{password}@{redis_host}:6379/0{query}"


def refresh_redis_url(core: kubernetes.client.CoreV1Api, namespace: str, name: str, redis_host: str, user: str,
                      ca_file: str | None) -> bool:
    """Point a kept Redis Secret's URL at how Redis is reached now (TLS turned on or off), with the
    password it holds (True when it changed). The patch names the version read."""
    secret = core.read_namespaced_secret(name, namespace)
    data = {key: base64.b64decode(value).decode() for key, value in (secret.data or {}).items()}
    wanted = redis_url(redis_host, user, data[REDIS_PASSWORD_KEY], ca_file)
    if data.get(REDIS_URL_KEY) == wanted:
        return False
    core.patch_namespaced_secret(name, namespace, {"metadata": {"resourceVersion": secret.metadata.resource_version},
                                                   "data": {REDIS_URL_KEY: base64.b64encode(wanted.encode()).decode()}})
    return True


def transport_secret_data() -> dict[str, str]:
    return {CURVE_SECRET_KEY_KEY: new_secret_key()}


def secret_body(name: str, data: dict[str, str], labels: dict[str, str]) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "labels": dict(labels)},
            "data": {key: base64.b64encode(value.encode()).decode() for key, value in data.items()}}


def ensure_secret(core: kubernetes.client.CoreV1Api, namespace: str, name: str, make_data, labels: dict[str, str]) -> bool:
    """Create the Secret when absent (True); keep it when present and holding every key `make_data`
    makes (False); SecretError when present without them. Two Jobs racing: the loser's create gets
    409 and keeps the winner's."""
    expected = make_data()
    try:
        existing = core.read_namespaced_secret(name, namespace)
    except kubernetes.client.ApiException as error:
        if error.status != 404:
            raise
    else:
        missing = sorted(set(expected) - set(existing.data or {}))
        if missing:
            raise SecretError(f"Secret {namespace}/{name} exists without {', '.join(missing)}: delete it to have it "
                              "made again, or name a Secret of yours in the chart's values")
        return False
    try:
        core.create_namespaced_secret(namespace, secret_body(name, expected, labels))
    except kubernetes.client.ApiException as error:
        if error.status == 409:
            return False
        raise
    return True


def rotate_transport_secret(core: kubernetes.client.CoreV1Api, namespace: str, name: str, step: str) -> None:
    """Take one step of a CURVE key rotation in the Secret (operators/curve_rotation.py; RotationError
    when it is not where the step starts). The patch names the version read: a change made
    meanwhile makes it fail (409) rather than be lost."""
    secret = core.read_namespaced_secret(name, namespace)
    before = {key: base64.b64decode(value).decode() for key, value in (secret.data or {}).items()}
    after = rotation_step(before, step, new_secret_key())
    changes = {key: base64.b64encode(value.encode()).decode() for key, value in after.items() if before.get(key) != value}
    removed = dict.fromkeys(set(before) - set(after))  # null removes a key in a merge patch
    core.patch_namespaced_secret(name, namespace, {"metadata": {"resourceVersion": secret.metadata.resource_version},
                                                   "data": {**changes, **removed}})
