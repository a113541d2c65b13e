"""A changed Secret value rolls the pods that read it: every pod template that reads the Redis
or the transport Secret carries a digest of the values those Secrets are made from, which
changes with them and only with them (a generated password or key is not in it, so two
renders of the same values agree although each generates its own)."""

from tests.helpers.helm_chart import engine_deployments, rendered_with, secret_values


def reads_a_secret(pod_template: dict) -> bool:
    refs = [env.get("valueFrom", {}).get("secretKeyRef", {}).get("name", "")
            for container in pod_template["spec"]["containers"] for env in container.get("env", [])]
    return any(name.endswith(("-redis", "-transport", "-redis-gateway", "-redis-engine", "-redis-operator"))
               for name in refs)


def checksums(objects) -> dict[str, str | None]:
    """The secrets digest of every workload whose pods read the Redis or transport Secret."""
    workloads = [o for o in objects if o["kind"] in ("Deployment", "StatefulSet")] + engine_deployments(objects)
    return {w["metadata"]["name"]: w["spec"]["template"]["metadata"].get("annotations", {}).get("checksum/secrets")
            for w in workloads if reads_a_secret(w["spec"]["template"])}


def test_every_pod_that_reads_a_secret_carries_the_digest_and_two_renders_agree(tmp_path):
    first, second = rendered_with("", tmp_path), rendered_with("", tmp_path)
    assert secret_values(first)["k25-redis"] != secret_values(second)["k25-redis"]  # each generated its own
    digests = checksums(first)
    assert {"k25-gateway", "k25-chunker", "k25-operator", "k25-redis"} <= set(digests)
    assert None not in digests.values() and digests == checksums(second)


def test_a_new_password_url_or_curve_setting_rolls_every_reader(tmp_path):
    before = checksums(rendered_with("redis: {auth: {password: one}}", tmp_path))
    for values in ("redis: {auth: {password: two}}",
                   "redis: {external: {url: 'redis://:x@elsewhere:6379/0'}}",
                   "redis: {auth: {password: one}}\ntransport: {curve: {enabled: false}}"):
        after = checksums(rendered_with(values, tmp_path))
        assert all(after[name] != before[name] for name in after), values
