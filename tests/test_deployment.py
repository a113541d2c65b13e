from operators.deployment import build_deployment, deployment_name, engine_args, pod_selector
from operators.pool_spec import parse_pool_spec

POOL = {"apiVersion": "k25.io/v1alpha1", "kind": "EnginePool",
        "metadata": {"name": "long", "namespace": "serving", "uid": "u-1"}}


def manifest(**spec):
    parsed = parse_pool_spec({"nodeType": "A100-80G", "model": "/m.gguf", "chunkSize": 4096, **spec})
    return build_deployment(POOL, parsed, 3, "redis://redis:6379/0", "prod")


def test_the_deployment_is_named_and_labelled_for_its_pool():
    deployment = manifest()
    assert deployment["metadata"]["name"] == deployment_name("long") == "long-engine"
    assert deployment["metadata"]["namespace"] == "serving"
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["selector"] == {"matchLabels": {"k25.io/pool": "long"}}
    assert deployment["spec"]["template"]["metadata"]["labels"]["k25.io/pool"] == "long"
    assert pod_selector("long") == "k25.io/pool=long"


def test_the_engine_gets_chunk_size_max_chunk_node_type_pool_and_redis():
    container = manifest()["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["k25", "engine", "--model", "/m.gguf", "--chunk-size", "4096",
                                 "--max-chunk-per-gpu", "4", "--node-type", "A100-80G", "--pool", "long",
                                 "--zmq-port", "5555", "--metrics-port", "9100", "--redis-url", "redis://redis:6379/0"]
    assert {"name": "K25_RELEASE", "value": "prod"} in container["env"]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "1"}}


def test_a_profiled_node_type_leaves_max_chunk_to_the_engine():
    args = engine_args(parse_pool_spec({"nodeType": "H200", "model": "m", "chunkSize": 64}), "p", "redis://r")
    assert "--max-chunk-per-gpu" not in args


def test_a_cpu_pool_asks_for_no_gpu_and_tolerates_no_gpu_taint():
    pod = manifest(nodeType="CPU", maxChunkPerGpu=1)["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"] == {}
    assert pod["tolerations"] == []


def test_node_selector_and_gpus_per_replica_reach_the_pod():
    pod = manifest(nodeSelector={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}, gpusPerReplica=2)
    spec = pod["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"


def test_the_pool_owns_the_deployment():
    assert manifest()["metadata"]["ownerReferences"] == [
        {"apiVersion": "k25.io/v1alpha1", "kind": "EnginePool", "name": "long", "uid": "u-1",
         "controller": True, "blockOwnerDeletion": True}]
