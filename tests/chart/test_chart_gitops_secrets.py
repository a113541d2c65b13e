"""generatedSecrets job: the release's generated credentials are made in the cluster by a hook Job
(`k25 secrets ensure`, tests/operator/test_generated_secrets.py) and never rendered, so `helm
template` (Argo CD, Flux) renders the same manifests every time; the Job makes exactly the Secrets
the pods read, with a ServiceAccount that may only read and create Secrets."""

import kubernetes_validate.utils as kv

from k25.cli import build_parser
from tests.helpers.helm_chart import CHART, NAMESPACE, RELEASE, helm, named, of_kind, operator_env, rendered_with, secret_values

JOB = "generatedSecrets: job\n"


def render_text(values: str, tmp_path) -> str:
    path = tmp_path / "values.yaml"
    path.write_text(values)
    result = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--values", str(path))
    assert result.returncode == 0, result.stderr
    return result.stdout


def job_args(objects):
    job = named(objects, "Job", f"{RELEASE}-secrets")
    return build_parser().parse_args(job["spec"]["template"]["spec"]["containers"][0]["args"][1:])


def test_every_render_is_the_same_and_holds_no_generated_credential(tmp_path):
    assert render_text(JOB, tmp_path) == render_text(JOB, tmp_path)
    objects = rendered_with(JOB, tmp_path)
    assert secret_values(objects) == {}
    for kind in ("ServiceAccount", "Role", "RoleBinding", "Job"):  # the rest are checked by test_chart_render
        kv.validate(named(objects, kind, f"{RELEASE}-secrets"), kv.latest_version(), strict=True)


def test_the_job_makes_the_secrets_the_pods_read_before_they_start(tmp_path):
    objects = rendered_with(JOB, tmp_path)
    args = job_args(objects)
    [redis] = of_kind(objects, "StatefulSet")
    redis_env = {e["name"]: e for e in redis["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert args.redis_secret == redis_env["REDISCLI_AUTH"]["valueFrom"]["secretKeyRef"]["name"]
    assert (args.namespace, args.redis_host) == (NAMESPACE, f"{RELEASE}-redis")
    assert args.transport_secret == operator_env(objects)["K25_CURVE_SECRET"]
    for kind in ("ServiceAccount", "Role", "RoleBinding", "Job"):
        annotations = named(objects, kind, f"{RELEASE}-secrets")["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert named(objects, "Role", f"{RELEASE}-secrets")["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create"]}]


def test_only_what_is_generated_is_left_to_the_job(tmp_path):
    objects = rendered_with(JOB + "redis:\n  auth:\n    password: given-in-values\n", tmp_path)
    assert secret_values(objects)[f"{RELEASE}-redis"]["redis-password"] == "given-in-values"
    args = job_args(objects)
    assert args.redis_secret is None and args.transport_secret == f"{RELEASE}-transport"
    own = "redis:\n  auth:\n    existingSecret: mine\ntransport:\n  curve:\n    existingSecret: ours\n"
    args = job_args(rendered_with(JOB + own, tmp_path))  # the parts' Redis users' Secrets are still generated
    assert (args.redis_secret, args.transport_secret) == (None, None)
    assert args.redis_user_secret == [f"{part}={RELEASE}-redis-{part}" for part in ("gateway", "engine", "operator")]
    users_off = own.replace("redis:\n", "redis:\n  users:\n    enabled: false\n")
    assert not of_kind(rendered_with(JOB + users_off, tmp_path), "Job")


def test_secrets_helm_generated_outlive_a_move_to_the_job(tmp_path):
    """Helm would delete a Secret it no longer renders after the pre-upgrade Job found it there:
    the generated ones carry resource-policy keep, so the Job's "kept as it was" stays true."""
    objects = rendered_with("generatedSecrets: helm\n", tmp_path)
    for name in (f"{RELEASE}-redis", f"{RELEASE}-transport"):
        assert named(objects, "Secret", name)["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    given = rendered_with("redis:\n  auth:\n    password: given-in-values\n", tmp_path)
    assert "annotations" not in named(given, "Secret", f"{RELEASE}-redis")["metadata"]
