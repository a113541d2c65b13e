"""The engines' weight quantization through the cluster's layers, as dtype goes: the CRD's
`quant` field (its pattern and rules), the operator's reading of it and the `--quant` flag it
gives the engine, and the chart's engine.quant and per-pool quant."""

import re

import pytest
import yaml

from common.quant_spec import INT4_GROUP_SIZES, LAYER_TYPES, PRESETS, WIDTHS, QuantSpecError, parse_quant_spec
from k25.cli import build_parser
from operators.pool_spec import PoolSpecError, parse_pool_spec
from tests.helpers.crd_schema import crd_for, custom_resource_errors
from tests.helpers.engine_pool import CPU_POOL, CRD, GPU_POOL, api_server_errors, engine_command
from tests.helpers.helm_chart import engine_deployments, of_kind, render_error, rendered, rendered_with
from tests.helpers.paths import K8S

QUANT_SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["quant"]


# --- the CRD's pattern says what the parser reads -------------------------------------------


WELL_FORMED = ["none", "small", "balanced,head=int8", "attn=int8", "embed=bf16,attn=int8,mlp=int4:g64,head=int8",
               "mlp=int4:g256", "head=int4"] + list(PRESETS)
# what the pattern refuses (the parser too); what it cannot see (a type twice, embed=int4) only the parser refuses
MALFORMED = ["", "ffn=int4", "mlp=int6", "attn=fp8", "attn=int8:g64", "mlp=int4:g16", "mlp=int4:64", "attn=int8,,mlp=int4",
             "attn=int8,small", "tiny", "attn = int8"]


def test_the_crd_pattern_names_the_parsers_presets_types_widths_and_group_sizes():
    pattern = QUANT_SCHEMA["pattern"]
    for words in (PRESETS, LAYER_TYPES, WIDTHS, map(str, INT4_GROUP_SIZES)):
        for word in words:
            assert re.search(rf"\b{word}\b", pattern), word


@pytest.mark.parametrize("text", WELL_FORMED)
def test_what_the_parser_reads_the_crd_and_the_operator_accept_on_a_cpu_pool(text):
    parse_quant_spec(text)
    assert re.fullmatch(QUANT_SCHEMA["pattern"], text)
    assert api_server_errors({**CPU_POOL, "quant": text}) == []
    assert parse_pool_spec({**CPU_POOL, "quant": text}).engine_settings["quant"] == text


@pytest.mark.parametrize("text", MALFORMED)
def test_what_the_parser_refuses_the_crd_and_the_operator_refuse(text):
    with pytest.raises(QuantSpecError):
        parse_quant_spec(text)
    assert not re.fullmatch(QUANT_SCHEMA["pattern"], text)
    assert any("does not match" in e for e in api_server_errors({**CPU_POOL, "quant": text}))
    with pytest.raises(PoolSpecError, match="spec.quant is not a weight spec: "):
        parse_pool_spec({**CPU_POOL, "quant": text})


@pytest.mark.parametrize("spec, reason", [
    ({**CPU_POOL, "dtype": "float32", "quant": "small"}, "quant needs dtype bfloat16 or auto"),
    ({**GPU_POOL, "dtype": "float16", "quant": "attn=int8"}, "quant needs dtype bfloat16 or auto"),
])
def test_quantised_weights_in_another_dtype_are_refused_by_the_crd_and_the_operator(spec, reason):
    assert any(reason in e for e in api_server_errors(spec)), api_server_errors(spec)
    with pytest.raises(PoolSpecError, match=re.escape(reason)):
        parse_pool_spec(spec)
    # none is no quantisation: allowed anywhere
    assert api_server_errors({**spec, "quant": "none"}) == [] and parse_pool_spec({**spec, "quant": "none"}).engine_settings["quant"] == "none"


def test_a_type_set_twice_passes_the_pattern_and_the_operator_refuses_it():
    assert api_server_errors({**CPU_POOL, "quant": "mlp=int4,mlp=int8"}) == []
    with pytest.raises(PoolSpecError, match="layer type 'mlp' is set twice"):
        parse_pool_spec({**CPU_POOL, "quant": "mlp=int4,mlp=int8"})


def test_the_printer_columns_show_the_quant_spec_beside_the_dtype():
    columns = [c["name"] for c in CRD["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns.index("Quant") == columns.index("DType") + 1


# --- the operator gives the engine --quant ---------------------------------------------------


def test_a_pools_quant_reaches_the_engine_as_the_cli_reads_it():
    args, parsed = engine_command({**CPU_POOL, "dtype": "bfloat16", "quant": "balanced,head=int4:g32"})
    assert args[args.index("--quant") + 1] == "balanced,head=int4:g32"
    assert (parsed.quant, parsed.dtype, parsed.device) == ("balanced,head=int4:g32", "bfloat16", "cpu")
    assert api_server_errors({**GPU_POOL, "quant": "small"}) == []  # on a GPU: the Triton kernel
    args, parsed = engine_command({**GPU_POOL, "quant": "small"})
    assert (parsed.quant, parsed.device) == ("small", "cuda")
    args, parsed = engine_command(CPU_POOL)
    assert "--quant" not in args and parsed.quant is None  # the engine's default: unquantised


# --- the chart -----------------------------------------------------------------------------


def pool_quant(objects) -> dict:
    return {p["metadata"]["name"]: p["spec"].get("quant") for p in of_kind(objects, "EnginePool")}


def engine_quant(objects) -> dict:
    return {d["metadata"]["name"].removesuffix("-engine"):
            build_parser().parse_args(d["spec"]["template"]["spec"]["containers"][0]["args"][1:]).quant
            for d in engine_deployments(objects)}


def test_by_default_the_chart_sets_no_quant():
    assert yaml.safe_load((K8S.parent / "charts" / "k25" / "values.yaml").read_text())["engine"]["quant"] is None
    objects = rendered(None)
    assert set(pool_quant(objects).values()) == {None} and set(engine_quant(objects).values()) == {None}


def test_engine_quant_sets_every_pool_and_a_pools_own_wins(tmp_path):
    objects = rendered_with(
        "engine:\n  quant: small\n  pools:\n"
        "    - {name: cpu-a, nodeType: CPU, chunkSize: 256}\n"
        "    - {name: cpu-b, nodeType: CPU, chunkSize: 256, quant: 'attn=int8,mlp=int4:g32'}\n"
        "    - {name: h100, nodeType: H100-80G, chunkSize: 8192, quant: none}\n"
        "    - {name: h200, nodeType: H200, chunkSize: 8192}\n", tmp_path)
    assert pool_quant(objects) == {"cpu-a": "small", "cpu-b": "attn=int8,mlp=int4:g32", "h100": "none", "h200": "small"}
    crds = of_kind(objects, "CustomResourceDefinition")
    assert [custom_resource_errors(p, crd_for(p, crds)) for p in of_kind(objects, "EnginePool")] == [[], [], [], []]
    assert engine_quant(objects) == {"cpu-a": "small", "cpu-b": "attn=int8,mlp=int4:g32", "h100": "none", "h200": "small"}


@pytest.mark.parametrize("values, reason", [
    ("engine:\n  pools:\n    - {name: cpu, nodeType: CPU, chunkSize: 256, quant: 'mlp=int6'}\n",
     "/engine/pools/0/quant': 'mlp=int6' does not match"),
    ("engine:\n  quant: tiny\n", "/engine/quant': 'tiny' does not match"),
    ("engine:\n  pools:\n    - {name: cpu, nodeType: CPU, chunkSize: 256, dtype: float32, quant: small}\n",
     "engine.pools[0] (cpu): quant needs dtype bfloat16 or auto, not float32"),
])
def test_the_chart_refuses_quant_where_the_engine_would(values, reason, tmp_path):
    assert reason in render_error(values, tmp_path)
