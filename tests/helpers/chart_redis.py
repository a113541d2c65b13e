"""The chart's own Redis as the rendered StatefulSet starts it, run here with the real
`redis-server`: its container's script, with the environment its Secret references resolve to
and its mounted files (the users' rules, the TLS certificate) written to a temporary folder, on
a free port. Each part then connects with the URL of its rendered Secret, pointed at that port."""

import contextlib
import os
import pathlib
import subprocess
import time
import urllib.parse

import redis

from tests.helpers.helm_chart import named, secret_values
from tests.helpers.redis_server import free_port

MOUNTS = {"/etc/k25/redis-users": "users", "/etc/k25/redis-tls": "tls"}


def redis_container(objects) -> dict:
    return named(objects, "StatefulSet", "k25-redis")["spec"]["template"]["spec"]["containers"][0]


def container_env(objects, container: dict) -> dict[str, str]:
    """The container's variables, each Secret reference resolved to the rendered Secret's value."""
    secrets = secret_values(objects)
    return {entry["name"]: entry["value"] if "value" in entry else
            secrets[entry["valueFrom"]["secretKeyRef"]["name"]][entry["valueFrom"]["secretKeyRef"]["key"]]
            for entry in container["env"]}


def part_url(objects, secret: str, port: int, folder: pathlib.Path) -> str:
    """The redis-url of a rendered Secret, pointed at 127.0.0.1:port instead of the Service, and at
    the CA `started` wrote to `folder` instead of the mounted one."""
    url = urllib.parse.urlsplit(secret_values(objects)[secret]["redis-url"])
    credentials = url.netloc.rpartition("@")[0]
    url = url._replace(netloc=f"{credentials}@127.0.0.1:{port}", query=url.query.replace("/etc/k25/redis-tls", f"{folder}/tls"))
    return urllib.parse.urlunsplit(url)


@contextlib.contextmanager
def started(objects, folder: pathlib.Path, tls_files: dict[str, bytes] | None = None):
    """Run the rendered Redis container's script; yields the port. `tls_files`: the TLS Secret's
    files (tls.crt, tls.key, ca.crt) the pod would mount."""
    container = redis_container(objects)
    script = container["args"][2]
    paths = {mount: folder / name for mount, name in MOUNTS.items()}
    paths["/etc/k25/redis-users"].mkdir()
    users = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "k25-redis-users"]
    for part, rules in (users[0]["data"] if users else {}).items():
        (paths["/etc/k25/redis-users"] / part).write_text(rules)
    if tls_files:
        paths["/etc/k25/redis-tls"].mkdir()
        for name, content in tls_files.items():
            (paths["/etc/k25/redis-tls"] / name).write_bytes(content)
    port = free_port()
    script = script.replace("/tmp/", f"{folder}/").replace("--dir /data", f"--dir {folder}")
    for mount, path in paths.items():
        script = script.replace(mount, str(path))
    script = script.replace("--tls-port 6379", f"--tls-port {port}") if tls_files else f"{script} --port {port}"
    env = {**os.environ, **container_env(objects, container)}
    log = folder / "redis.log"
    with log.open("wb") as output:
        process = subprocess.Popen(["sh", "-c", f"{script} --bind 127.0.0.1"], env=env, stdout=output,
                                   stderr=subprocess.STDOUT)
    try:
        _wait_until_up(process, port, env["REDISCLI_AUTH"], folder if tls_files else None, log)
        yield port
    finally:
        process.kill()
        process.wait()


def _wait_until_up(process: subprocess.Popen, port: int, password: str, tls_folder: pathlib.Path | None,
                   log: pathlib.Path, timeout_s: float = 10.0) -> None:
    tls = {} if tls_folder is None else {"ssl": True, "ssl_ca_certs": str(tls_folder / "tls" / "ca.crt")}
    client = redis.Redis(host="127.0.0.1", port=port, password=password, **tls)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if process.poll() is not None or time.monotonic() > deadline:
                    process.kill()
                    process.wait()
                    raise RuntimeError(f"the chart's Redis did not start: {log.read_text()[-2000:]}") from None
                time.sleep(0.02)
    finally:
        client.close()
