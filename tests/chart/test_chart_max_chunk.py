"""`maxChunkPerGpu: auto` and `expectedChunksPerRequest` through the cluster's layers, as dtype
and quant go: the CRD (int-or-string, its bounds and rule), the operator's reading of it, the
`k25 engine` flags it gives, the chart's pools, and the engine CLI's refusals."""

import pytest

from k25.cli import build_parser
from operators.pool_spec import PoolSpecError, parse_pool_spec
from tests.helpers.crd_schema import crd_for, custom_resource_errors
from tests.helpers.engine_pool import GPU_POOL, api_server_errors, engine_command
from tests.helpers.helm_chart import engine_deployments, of_kind, render_error, rendered_with


@pytest.mark.parametrize("fields, expected", [
    ({"maxChunkPerGpu": "auto"}, ("auto", 1)),
    ({"maxChunkPerGpu": "auto", "expectedChunksPerRequest": 6}, ("auto", 6)),
    ({"maxChunkPerGpu": 6}, (6, 1)),  # a profile's recommendation, pasted
    ({"nodeType": "MI300X", "maxChunkPerGpu": "auto"}, ("auto", 1)),  # auto sizes any node type from its memory
])
def test_what_the_crd_accepts_the_operator_hands_the_engine_as_its_cli_reads_it(fields, expected):
    spec = {**GPU_POOL, **fields}
    assert api_server_errors(spec) == []
    _, parsed = engine_command(spec)
    assert (parsed.max_chunk_per_gpu, parsed.expected_chunks_per_request) == expected


@pytest.mark.parametrize("fields, crd_says, operator_says", [
    ({"maxChunkPerGpu": "8"}, "does not match '^auto$'", "must be an integer or auto"),
    ({"maxChunkPerGpu": "Auto"}, "does not match '^auto$'", "must be an integer or auto"),
    ({"maxChunkPerGpu": 0}, "less than the minimum of 1", "must be at least 1"),
    ({"maxChunkPerGpu": 1.5}, "is not valid under any of the given schemas", "must be an integer or auto"),
    ({"maxChunkPerGpu": "auto", "expectedChunksPerRequest": 0}, "less than the minimum of 1", "must be at least 1"),
    ({"expectedChunksPerRequest": 6}, "expectedChunksPerRequest is read only with maxChunkPerGpu auto",
     "read only with spec.maxChunkPerGpu auto"),
    ({"maxChunkPerGpu": 8, "expectedChunksPerRequest": 6}, "expectedChunksPerRequest is read only with maxChunkPerGpu auto",
     "read only with spec.maxChunkPerGpu auto"),
])
def test_what_the_crd_refuses_the_operator_refuses(fields, crd_says, operator_says):
    errors = api_server_errors({**GPU_POOL, **fields})
    assert any(crd_says in e for e in errors), errors
    with pytest.raises(PoolSpecError, match=operator_says):
        parse_pool_spec({**GPU_POOL, **fields})


# --- the engine's CLI ----------------------------------------------------------------------


@pytest.mark.parametrize("value, message", [
    ("0", "must be at least 1 (or auto), got 0"),
    ("eight", "expected a whole number of chunks or auto, got 'eight'"),
    ("AUTO", "expected a whole number of chunks or auto, got 'AUTO'"),
])
def test_the_engine_refuses_a_max_chunk_per_gpu_that_is_neither_a_number_nor_auto(value, message, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["engine", "--max-chunk-per-gpu", value])
    assert f"argument --max-chunk-per-gpu: {message}" in capsys.readouterr().err


def test_the_engine_refuses_expected_chunks_below_one_before_anything_loads(capsys):
    args = build_parser().parse_args(["engine", "--max-chunk-per-gpu", "auto", "--expected-chunks-per-request", "0"])
    assert args.handler(args) == 2
    assert capsys.readouterr().err.strip() == "k25 engine: --expected-chunks-per-request must be at least 1, got 0"


# --- the chart -----------------------------------------------------------------------------


def test_a_pool_with_auto_renders_to_an_enginepool_the_crd_takes_and_an_engine_started_with_auto(tmp_path):
    objects = rendered_with(
        "engine:\n  pools:\n"
        "    - {name: docs, nodeType: H200, chunkSize: 1024, maxChunkPerGpu: auto, expectedChunksPerRequest: 6}\n"
        "    - {name: cpu, nodeType: CPU, chunkSize: 256, maxChunkPerGpu: 12}\n", tmp_path)
    pools = {p["metadata"]["name"]: p for p in of_kind(objects, "EnginePool")}
    assert pools["docs"]["spec"]["maxChunkPerGpu"] == "auto" and pools["docs"]["spec"]["expectedChunksPerRequest"] == 6
    crds = of_kind(objects, "CustomResourceDefinition")
    assert [custom_resource_errors(p, crd_for(p, crds)) for p in pools.values()] == [[], []]
    flags = {d["metadata"]["name"]: build_parser().parse_args(d["spec"]["template"]["spec"]["containers"][0]["args"][1:])
             for d in engine_deployments(objects)}
    assert (flags["docs-engine"].max_chunk_per_gpu, flags["docs-engine"].expected_chunks_per_request) == ("auto", 6)
    assert flags["cpu-engine"].max_chunk_per_gpu == 12


@pytest.mark.parametrize("pool, reason", [
    ("{name: h, nodeType: H200, chunkSize: 1024, maxChunkPerGpu: '8'}", "/engine/pools/0/maxChunkPerGpu': '8' does not match"),
    ("{name: h, nodeType: H200, chunkSize: 1024, maxChunkPerGpu: 0}", "/engine/pools/0/maxChunkPerGpu': minimum: got 0, want 1"),
    ("{name: h, nodeType: H200, chunkSize: 1024, expectedChunksPerRequest: 6}", "missing property 'maxChunkPerGpu'"),
    ("{name: h, nodeType: H200, chunkSize: 1024, maxChunkPerGpu: 8, expectedChunksPerRequest: 6}",
     "/engine/pools/0/maxChunkPerGpu': value must be 'auto'"),
])
def test_the_chart_refuses_what_the_crd_refuses(pool, reason, tmp_path):
    assert reason in render_error(f"engine:\n  pools:\n    - {pool}\n", tmp_path)
