"""What an engine pod asks of its node: CPU and memory (never BestEffort), its GPUs as a limit, a
priority class when the pool names one, and a spread of the pool's pods over nodes; each valid
for Kubernetes (its own schema) and bad resources refused with the field named."""

import kubernetes_validate.utils as kv
import pytest

from operators.config import OperatorConfig
from operators.deployment import build_deployment
from operators.pool_spec import PoolSpecError, parse_pool_spec

POOL = {"apiVersion": "k25.io/v1alpha1", "kind": "EnginePool",
        "metadata": {"name": "h100", "namespace": "serving", "uid": "u-1"}}
CONFIG = OperatorConfig(release="prod", redis_url="redis://redis:6379/0")


def pod(**spec) -> dict:
    parsed = parse_pool_spec({"nodeType": "H100-80G", "model": "m", "chunkSize": 8192, **spec})
    deployment = build_deployment(POOL, parsed, 2, CONFIG, {})
    kv.validate(deployment, kv.latest_version(), strict=True)  # raises on anything Kubernetes would refuse
    return deployment["spec"]["template"]["spec"]


def test_by_default_an_engine_requests_cpu_and_memory_and_its_gpus_and_spreads_over_nodes():
    spec = pod(gpusPerReplica=2, backend="vllm")  # K25's engine runs on one GPU
    assert spec["containers"][0]["resources"] == {"requests": {"cpu": "1", "memory": "4Gi"},
                                                  "limits": {"nvidia.com/gpu": "2"}}
    assert spec["topologySpreadConstraints"] == [{
        "maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": {"k25.io/pool": "h100"}}}]
    assert "priorityClassName" not in spec


def test_by_default_a_k25_engine_also_requests_the_memory_of_its_kv_host_tier():
    """The tier's pages are touched as blocks arrive: unrequested, they would overcommit the node."""
    assert pod()["containers"][0]["resources"]["requests"] == {"cpu": "1", "memory": "8Gi"}  # 4Gi + the 4 GiB default
    assert pod(kvHostTierGib=10.5)["containers"][0]["resources"]["requests"]["memory"] == "15Gi"
    assert pod(kvHostTierGib=0)["containers"][0]["resources"]["requests"]["memory"] == "4Gi"
    assert pod(prefixCaching=False)["containers"][0]["resources"]["requests"]["memory"] == "4Gi"  # no tiers then


def test_the_pools_resources_and_priority_class_reach_the_pod():
    spec = pod(resources={"requests": {"cpu": 4, "memory": "32Gi"}, "limits": {"memory": "64Gi"}},
               priorityClassName="inference-high")
    assert spec["containers"][0]["resources"] == {"requests": {"cpu": "4", "memory": "32Gi"},
                                                  "limits": {"memory": "64Gi", "nvidia.com/gpu": "1"}}
    assert spec["priorityClassName"] == "inference-high"


@pytest.mark.parametrize("resources, message", [
    ({"requests": {"nvidia.com/gpu": "1"}}, "spec.resources requests.nvidia.com/gpu: takes cpu, memory"),
    ({"requests": {"cpu": "lots"}}, "spec.resources requests.cpu: 'lots' is not a quantity"),
    ({"requests": {"memory": True}}, "spec.resources requests.memory: True is not a quantity"),
    ({"claims": []}, "spec.resources takes requests and limits only"),
    ({"limits": ["cpu"]}, "spec.resources limits must map resource names to quantities"),
])
def test_bad_resources_are_refused_naming_the_field(resources, message):
    with pytest.raises(PoolSpecError, match=message.replace(".", r"\.").replace("(", r"\(")):
        parse_pool_spec({"nodeType": "CPU", "model": "m", "chunkSize": 256, "resources": resources})
