"""The engine backend through the cluster's layers: K25's engine on one GPU, vLLM's over a pool's
gpusPerReplica (tensor parallel). The CRD's rules and the operator refuse what a backend cannot
serve, the operator gives what it can the `k25 engine` flags it takes, and the chart runs vLLM's
pools from vllmEngineImage and refuses the same pools before anything is installed."""

import pytest

from k25.cli import build_parser
from k25.commands.engine import invalid_flags
from operators.image_policy import image_refusal
from operators.pool_spec import PoolSpecError, parse_pool_spec
from tests.helpers.crd_schema import crd_for, custom_resource_errors
from tests.helpers.engine_pool import CPU_POOL, GPU_POOL, api_server_errors, engine_command
from tests.helpers.helm_chart import engine_deployments, of_kind, render_error, rendered_with

VLLM = {**GPU_POOL, "backend": "vllm"}


@pytest.mark.parametrize("spec, expected", [
    ({**GPU_POOL, "gpusPerReplica": 1}, ("k25", 1, "cuda")),
    ({**VLLM, "gpusPerReplica": 1}, ("vllm", 1, "cuda")),
    ({**VLLM, "gpusPerReplica": 4}, ("vllm", 4, "cuda")),
    ({**VLLM, "nodeType": "H200", "maxChunkPerGpu": 6, "gpusPerReplica": 8}, ("vllm", 8, "cuda")),
    ({**CPU_POOL, "backend": "vllm"}, ("vllm", 1, "cpu")),  # on a CPU it takes as many chunks as fit
    ({**VLLM, "lora": {"maxLoras": 2}}, ("vllm", 1, "cuda")),  # the torch kernel, the CRD's default
    ({**VLLM, "gpusPerReplica": 4, "expertParallel": True}, ("vllm", 4, "cuda")),
])
def test_what_the_crd_accepts_the_operator_hands_the_engine_as_its_cli_takes_it(spec, expected):
    assert api_server_errors(spec) == []
    _, parsed = engine_command(spec)
    assert (parsed.backend, parsed.tensor_parallel_size, parsed.device) == expected
    assert parsed.expert_parallel == bool(spec.get("expertParallel"))
    assert invalid_flags(parsed) == ""


@pytest.mark.parametrize("fields, crd_says, operator_says", [
    ({**GPU_POOL, "gpusPerReplica": 2}, "K25's engine runs on one GPU: gpusPerReplica above 1 needs backend vllm",
     "spec.gpusPerReplica 2: K25's engine runs on one GPU; set backend: vllm"),
    ({**GPU_POOL, "backend": "k25", "gpusPerReplica": 8}, "K25's engine runs on one GPU",
     "spec.gpusPerReplica 8: K25's engine runs on one GPU"),
    ({**GPU_POOL, "expertParallel": True}, "expertParallel needs backend vllm: K25's engine serves no mixture of experts",
     "spec.expertParallel: K25's engine serves no mixture of experts; set backend: vllm"),
    ({**VLLM, "quant": "small"}, "quant is K25's engine's: backend vllm serves the checkpoint's own quantisation",
     "spec.quant is K25's engine's"),
    ({**VLLM, "maxChunkPerGpu": "auto"}, "maxChunkPerGpu auto is K25's engine's: with backend vllm give a number",
     "spec.maxChunkPerGpu auto is K25's engine's"),
    ({**VLLM, "nodeType": "H200"}, "maxChunkPerGpu is required with backend vllm on a GPU",
     "spec.maxChunkPerGpu is required with backend vllm on node type H200"),
    ({**CPU_POOL, "backend": "vllm", "gpusPerReplica": 1}, "maxChunkPerGpu is required with backend vllm on a GPU",
     "spec.maxChunkPerGpu is required with backend vllm on node type CPU"),
    ({**VLLM, "chunkSize": 1000}, "chunkSize must be a multiple of 32 with backend vllm",
     "spec.chunkSize 1000 must be a multiple of 32 with backend vllm"),
    ({**VLLM, "lora": {"maxLoras": 2, "kernel": "triton"}}, "lora.kernel triton is K25's engine's: with backend vllm use torch",
     "spec.lora.kernel triton is K25's engine's"),
    ({**VLLM, "backend": "tgi"}, "is not one of ['k25', 'vllm']", "spec.backend must be one of k25, vllm, got 'tgi'"),
])
def test_what_the_crd_refuses_the_operator_refuses(fields, crd_says, operator_says):
    errors = api_server_errors(fields)
    assert any(crd_says in e for e in errors), errors
    with pytest.raises(PoolSpecError, match=operator_says):
        parse_pool_spec(fields)


# --- the chart -----------------------------------------------------------------------------


def pools_yaml(*pools: str, engine: str = "") -> str:
    return "engine:\n" + engine + "  pools:\n" + "".join(f"    - {pool}\n" for pool in pools)


def test_a_vllm_pool_over_four_gpus_runs_the_vllm_image_tensor_parallel_and_valid_against_the_crd(tmp_path):
    objects = rendered_with(
        "vllmEngineImage: {repository: registry.example/k25-engine-vllm, tag: '2.0'}\n" + pools_yaml(
            "{name: big, nodeType: H100-80G, chunkSize: 8192, maxChunkPerGpu: 8, backend: vllm, gpusPerReplica: 4}",
            "{name: small, nodeType: H100-80G, chunkSize: 2048}"), tmp_path)
    pools = {p["metadata"]["name"]: p for p in of_kind(objects, "EnginePool")}
    assert {name: p["spec"]["image"] for name, p in pools.items()} == {
        "big": "registry.example/k25-engine-vllm:2.0", "small": "k25-engine:0.1.0"}
    assert (pools["big"]["spec"]["backend"], pools["big"]["spec"]["gpusPerReplica"]) == ("vllm", 4)
    crds = of_kind(objects, "CustomResourceDefinition")
    assert {name: custom_resource_errors(p, crd_for(p, crds)) for name, p in pools.items()} == {"big": [], "small": []}
    [big] = [d for d in engine_deployments(objects) if d["metadata"]["name"] == "big-engine"]
    container = big["spec"]["template"]["spec"]["containers"][0]
    parsed = build_parser().parse_args(container["args"][1:])
    assert (container["image"], parsed.backend, parsed.tensor_parallel_size) == ("registry.example/k25-engine-vllm:2.0", "vllm", 4)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"


def test_engine_backend_vllm_runs_every_pool_from_the_vllm_image_but_a_pools_own_backend_or_image(tmp_path):
    objects = rendered_with(pools_yaml(
        "{name: a, nodeType: H100-80G, chunkSize: 8192}",
        "{name: b, nodeType: H100-80G, chunkSize: 8192, backend: k25}",
        "{name: c, nodeType: H100-80G, chunkSize: 8192, image: 'mirror.example/vllm:1'}",
        engine="  backend: vllm\n"), tmp_path)
    assert {p["metadata"]["name"]: (p["spec"]["backend"], p["spec"]["image"]) for p in of_kind(objects, "EnginePool")} == {
        "a": ("vllm", "k25-engine-vllm:0.1.0"), "b": ("k25", "k25-engine:0.1.0"), "c": ("vllm", "mirror.example/vllm:1")}


def test_the_operator_runs_the_vllm_image_the_chart_names_and_no_other(tmp_path):
    objects = rendered_with("vllmEngineImage: {repository: registry.example/k25-engine-vllm, tag: '2.0'}\n"
                            + pools_yaml("{name: big, nodeType: H100-80G, chunkSize: 8192, backend: vllm}"), tmp_path)
    [operator] = [d for d in of_kind(objects, "Deployment") if d["metadata"]["name"].endswith("-operator")]
    allowed = tuple(build_parser().parse_args(operator["spec"]["template"]["spec"]["containers"][0]["args"][1:]).allowed_images)
    assert allowed == ("k25-engine", "registry.example/k25-engine-vllm")
    assert [image_refusal(p["spec"]["image"], allowed) for p in of_kind(objects, "EnginePool")] == [None]
    assert image_refusal("vllm/vllm-openai:v0.32.0", allowed) is not None


@pytest.mark.parametrize("values, message", [
    (pools_yaml("{name: h, nodeType: H100-80G, chunkSize: 8192, gpusPerReplica: 2}"),
     "engine.pools[0] (h): gpusPerReplica 2: K25's engine runs on one GPU; set backend: vllm"),
    (pools_yaml("{name: h, nodeType: H100-80G, chunkSize: 8192, expertParallel: true}"),
     "engine.pools[0] (h): expertParallel: K25's engine serves no mixture of experts; set backend: vllm"),
    (pools_yaml("{name: h, nodeType: H100-80G, chunkSize: 8192, backend: vllm, quant: small}"),
     "engine.pools[0] (h): quant is K25's engine's: backend vllm serves the checkpoint's own quantisation"),
    # engine's quant reaches every pool without its own
    (pools_yaml("{name: h, nodeType: H100-80G, chunkSize: 8192, backend: vllm}", engine="  quant: small\n"),
     "engine.pools[0] (h): quant is K25's engine's"),
    (pools_yaml("{name: h, nodeType: H200, chunkSize: 8192, backend: vllm, maxChunkPerGpu: auto}"),
     "engine.pools[0] (h): maxChunkPerGpu auto is K25's engine's: with backend vllm give a number"),
    (pools_yaml("{name: h, nodeType: H200, chunkSize: 8192, backend: vllm}"),
     "engine.pools[0] (h): maxChunkPerGpu is required with backend vllm on node type H200"),
    (pools_yaml("{name: h, nodeType: H100-80G, chunkSize: 1000, backend: vllm}"),
     "engine.pools[0] (h): chunkSize 1000 must be a multiple of 32 with backend vllm"),
    (pools_yaml("{name: h, nodeType: H100-80G, chunkSize: 8192, backend: vllm, lora: {maxLoras: 2, kernel: triton}}"),
     "engine.pools[0] (h): lora.kernel triton is K25's engine's: with backend vllm use torch"),
    ("vllmEngineImage: {repository: 'k25 engine'}\n", "/vllmEngineImage/repository': 'k25 engine' does not match"),
    (pools_yaml("{name: h, nodeType: H100-80G, chunkSize: 8192, nodesPerReplica: 2}"),
     "engine.pools[0] (h): nodesPerReplica 2: K25's engine runs on one node; set backend: vllm"),
    # engine's nodesPerReplica reaches every pool without its own
    (pools_yaml("{name: h, nodeType: H100-80G, chunkSize: 8192}", engine="  nodesPerReplica: 2\n"),
     "engine.pools[0] (h): nodesPerReplica 2: K25's engine runs on one node"),
    (pools_yaml("{name: h, nodeType: H100-80G, chunkSize: 8192, backend: vllm, nodesPerReplica: 0}"),
     "/engine/pools/0/nodesPerReplica'"),
])
def test_the_chart_refuses_what_the_crd_and_the_operator_refuse(values, message, tmp_path):
    assert message in render_error(values, tmp_path)
