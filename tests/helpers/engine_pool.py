"""An EnginePool spec through the cluster's layers, for tests of one field: the API server's
verdict on it (the CRD's schema) and the `k25 engine` command the operator's Deployment gives."""

import argparse

import yaml

from k25.cli import build_parser
from operators.config import OperatorConfig
from operators.deployment import build_deployment
from operators.pool_spec import parse_pool_spec
from tests.helpers.crd_schema import custom_resource_errors
from tests.helpers.paths import CRDS

CRD = yaml.safe_load((CRDS / "enginepool.yaml").read_text())
CPU_POOL = {"nodeType": "CPU", "model": "m", "chunkSize": 256}
GPU_POOL = {"nodeType": "H100-80G", "model": "m", "chunkSize": 512}
_POOL = {"apiVersion": "k25.io/v1alpha1", "kind": "EnginePool", "metadata": {"name": "p", "namespace": "s", "uid": "u"}}
_CONFIG = OperatorConfig(release="prod", redis_url="redis://redis:6379/0", redis_secret="prod-k25-redis")


def api_server_errors(spec: dict) -> list[str]:
    """What the API server would say of an EnginePool with this spec; [] when it takes it."""
    return custom_resource_errors({**_POOL, "metadata": {"name": "p"}, "spec": spec}, CRD)


def engine_command(spec: dict) -> tuple[list[str], argparse.Namespace]:
    """The engine container's arguments for this spec, and `k25 engine` reading them."""
    args = build_deployment(_POOL, parse_pool_spec(spec), 1, _CONFIG, {})["spec"]["template"]["spec"]["containers"][0]["args"]
    return args, build_parser().parse_args(args[1:])
