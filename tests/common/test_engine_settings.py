"""The engine's compute settings are declared once (common/engine_settings.py): the `k25 engine`
flags, the engine's config, the operator's reading of a pool and the arguments it writes come
from that table, and the CRD, the chart's schema, its values and its template are written from it
(charts/gen_engine_settings.py): here they are held to it, so a setting added to the table and
not regenerated fails, and what the generator writes says what the table says."""

import dataclasses
import importlib.util
import json
import re

import pytest
import yaml

from common.engine_settings import SETTINGS, SettingError, engine_args, read_spec
from engine.base.config import EngineConfig
from k25.cli import build_parser
from operators.deployment import engine_args as pool_engine_args
from operators.pool_spec import PoolSpecError, parse_pool_spec
from tests.helpers.paths import CRDS, REPO

CHART = REPO / "charts" / "k25"
CRD_SPEC = yaml.safe_load((CRDS / "enginepool.yaml").read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
    "properties"]["spec"]["properties"]
VALUES_SCHEMA = json.loads((CHART / "values.schema.json").read_text())
POOL_SCHEMA = VALUES_SCHEMA["definitions"]["pool"]["properties"]
ENGINE_SCHEMA = VALUES_SCHEMA["properties"]["engine"]["properties"]
ENGINE_VALUES = yaml.safe_load((CHART / "values.yaml").read_text())["engine"]
SAMPLES = {"integer": [1, 7, 4096], "number": [0.5, 1.0], "boolean": [True, False], "string": []}
MINIMAL_POOL = {"nodeType": "H100-80G", "model": "smollm2-135m", "chunkSize": 256}
ids = [setting.name for setting in SETTINGS]


def schema_bounds(schema: dict) -> dict:
    """A schema's constraints: the CRD's exclusiveMinimum is OpenAPI v3.0's flag on minimum, the
    chart's is JSON Schema's number."""
    exclusive = schema.get("exclusiveMinimum")
    numeric = exclusive is not None and not isinstance(exclusive, bool)
    return {"minimum": exclusive if numeric else schema.get("minimum"), "maximum": schema.get("maximum"),
            "exclusive": numeric or bool(exclusive), "enum": tuple(schema.get("enum", ()))}


def setting_bounds(setting) -> dict:
    return {"minimum": setting.minimum, "maximum": setting.maximum, "exclusive": setting.exclusive_minimum,
            "enum": setting.choices}


@pytest.mark.parametrize("setting", SETTINGS, ids=ids)
def test_the_crd_declares_each_setting_as_the_table_does(setting):
    field = CRD_SPEC.get(setting.field)
    assert field is not None, f"the EnginePool CRD has no spec.{setting.field}"
    assert field["type"] == setting.kind and schema_bounds(field) == setting_bounds(setting)
    assert f"--{setting.flag[2:]}" in field["description"] or f"--no-{setting.flag[2:]}" in field["description"]
    if setting.kind == "boolean":
        assert field["default"] == setting.default


@pytest.mark.parametrize("setting", SETTINGS, ids=ids)
def test_the_chart_takes_each_setting_per_pool_and_as_every_pools_default(setting):
    pool = POOL_SCHEMA.get(setting.field)
    assert pool is not None, f"values.schema.json: a pool has no {setting.field}"
    assert pool["type"] == setting.kind and schema_bounds(pool) == setting_bounds(setting)
    engine = ENGINE_SCHEMA.get(setting.field)
    assert engine is not None, f"values.schema.json: engine has no {setting.field} (every pool's default)"
    assert engine["type"] == [setting.kind, "null"] and {**schema_bounds(engine), "enum": ()} == {
        **setting_bounds(setting), "enum": ()} and set(engine.get("enum", [None])) == {*setting.choices, None}
    assert ENGINE_VALUES.get(setting.field, "absent") is None, f"values.yaml: engine.{setting.field} is not null"
    template = (CHART / "templates" / "_engine_settings.tpl").read_text()
    [fields] = re.findall(r'define "k25.engineSettingFields" -}}([\w ]+){{-', template)
    assert setting.field in fields.split(), "k25.poolCompute does not carry it from engine to the pools"


def test_the_chart_files_are_as_the_table_writes_them():
    spec = importlib.util.spec_from_file_location("gen_engine_settings", REPO / "charts" / "gen_engine_settings.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    stale = [str(path.relative_to(REPO)) for path, text in generator.rendered().items() if path.read_text() != text]
    assert not stale, f"{', '.join(stale)}: stale against common/engine_settings.py; run `make engine-settings`"


@pytest.mark.parametrize("setting", SETTINGS, ids=ids)
def test_k25_engine_has_each_flag_with_the_tables_default_and_the_config_its_field(setting):
    parsed = build_parser().parse_args(["engine"])
    assert getattr(parsed, setting.name) == setting.default
    fields = {f.name: f for f in dataclasses.fields(EngineConfig)}
    assert setting.name in fields
    if setting.name not in ("dtype", "quant"):  # resolved at start: auto to a dtype, a spec to its canonical form
        assert fields[setting.name].default == setting.default


@pytest.mark.parametrize("setting", [s for s in SETTINGS if SAMPLES[s.kind]], ids=lambda s: s.name)
def test_a_pools_value_reaches_the_engine_as_set(setting):
    """pool spec -> the operator's engine arguments -> `k25 engine`'s parser: the same value."""
    backend = {"expert_parallel": "vllm", "pipeline_parallel_size": "vllm"}.get(setting.name, "k25")  # only vLLM's
    for value in SAMPLES[setting.kind]:
        spec = parse_pool_spec({**MINIMAL_POOL, "backend": backend, setting.field: value})
        args = pool_engine_args(spec, "pool", "k25")
        assert getattr(build_parser().parse_args(args[1:]), setting.name) == value


def test_strings_reach_the_engine_as_set():
    spec = parse_pool_spec({**MINIMAL_POOL, "dtype": "bfloat16", "quant": "attn=int8,mlp=int4:g32"})
    parsed = build_parser().parse_args(pool_engine_args(spec, "pool", "k25")[1:])
    assert (parsed.dtype, parsed.quant) == ("bfloat16", "attn=int8,mlp=int4:g32")


def test_only_what_a_pool_sets_becomes_an_argument_and_a_switch_only_when_off():
    assert engine_args({}) == []
    assert engine_args({"prefix_caching": True, "cuda_graphs": False, "max_num_seqs": 8}) == [
        "--max-num-seqs", "8", "--no-cuda-graphs"]
    assert read_spec({"maxNumSeqs": None, "dtype": "auto"}) == {"dtype": "auto"}


@pytest.mark.parametrize("flag, value, fragment", [
    ("--max-num-seqs", "0", "must be at least 1, got 0"),
    ("--max-num-seqs", "many", "expected an integer, got 'many'"),
    ("--gpu-memory-utilization", "0", "must be above 0, got 0"),
    ("--gpu-memory-utilization", "1.5", "must be at most 1, got 1.5"),
    ("--overtake-limit-s", "nan", "must be a number, got nan"),
    ("--quant", "attn=int6", "int6"),
])
def test_a_bad_flag_is_refused_by_the_parser_with_the_reason(flag, value, fragment, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["engine", flag, value])
    assert fragment in capsys.readouterr().err


@pytest.mark.parametrize("spec, message", [
    ({"maxNumSeqs": True}, "spec.maxNumSeqs must be an integer, got True"),
    ({"prefixCaching": "yes"}, "spec.prefixCaching must be true or false, got 'yes'"),
    ({"quant": 8}, "spec.quant must be a string, got 8"),
])
def test_a_bad_pool_value_names_its_field(spec, message):
    with pytest.raises(SettingError, match=re.escape(message)):
        read_spec(spec)
    with pytest.raises(PoolSpecError, match=re.escape(message)):
        parse_pool_spec({**MINIMAL_POOL, **spec})
