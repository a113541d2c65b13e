"""The engines' compute settings through the chart: engine.dtype, .maxNumBatchedTokens,
.maxNumSeqs, .gpuMemoryUtilization and .overtakeLimitS and each pool's own keys become the
EnginePools' spec fields (valid against the CRD), which the operator turns into `k25 engine`
flags; left null they write nothing and the engine keeps its own defaults (a value such as
overtakeLimitS 0, first come, first served, is a setting)."""

import yaml

from k25.cli import build_parser
from tests.helpers.crd_schema import crd_for, custom_resource_errors
from tests.helpers.helm_chart import CHART, CI_VALUES, engine_deployments, of_kind, rendered, rendered_with, value_set_id

FIELDS = ("dtype", "maxNumBatchedTokens", "maxNumSeqs", "gpuMemoryUtilization")
MANY_POOLS = next(v for v in CI_VALUES if value_set_id(v) == "many-pools")


def compute_of_pools(objects) -> dict[str, dict]:
    return {p["metadata"]["name"]: {k: p["spec"][k] for k in FIELDS if k in p["spec"]} for p in of_kind(objects, "EnginePool")}


def engine_settings(objects) -> dict[str, tuple]:
    """(dtype, max_num_batched_tokens, max_num_seqs, gpu_memory_utilization, device) each pool's engine is started with."""
    settings = {}
    for deployment in engine_deployments(objects):
        args = build_parser().parse_args(deployment["spec"]["template"]["spec"]["containers"][0]["args"][1:])
        settings[deployment["metadata"]["name"].removesuffix("-engine")] = (
            args.dtype, args.max_num_batched_tokens, args.max_num_seqs, args.gpu_memory_utilization, args.device)
    return settings


def test_by_default_no_pool_sets_them_and_the_engines_keep_their_own_defaults():
    values = yaml.safe_load((CHART / "values.yaml").read_text())["engine"]
    assert {k: values[k] for k in FIELDS} == dict.fromkeys(FIELDS)
    objects = rendered(None)
    assert compute_of_pools(objects) == {"a100-40g": {}, "a100-80g": {}, "h100-80g": {}}
    engine = build_parser().parse_args(["engine"])
    defaults = (engine.dtype, engine.max_num_batched_tokens, engine.max_num_seqs, engine.gpu_memory_utilization)
    assert set(engine_settings(objects).values()) == {(*defaults, "cuda")}


def test_engine_sets_every_pool_and_a_pools_own_key_wins(tmp_path):
    objects = rendered_with(
        "engine:\n  dtype: bfloat16\n  maxNumBatchedTokens: 1024\n  maxNumSeqs: 128\n  gpuMemoryUtilization: 0.85\n"
        "  pools:\n"
        "    - {name: h100, nodeType: H100-80G, chunkSize: 8192}\n"
        "    - {name: h200, nodeType: H200, chunkSize: 8192, dtype: float16, maxNumSeqs: 256, gpuMemoryUtilization: 0.95}\n"
        "    - {name: cpu, nodeType: CPU, chunkSize: 256, dtype: auto, maxNumBatchedTokens: 256}\n", tmp_path)
    assert compute_of_pools(objects) == {
        "h100": {"dtype": "bfloat16", "maxNumBatchedTokens": 1024, "maxNumSeqs": 128, "gpuMemoryUtilization": 0.85},
        "h200": {"dtype": "float16", "maxNumBatchedTokens": 1024, "maxNumSeqs": 256, "gpuMemoryUtilization": 0.95},
        # a pool's own auto wins over engine.dtype: the engine measures on its CPU
        "cpu": {"dtype": "auto", "maxNumBatchedTokens": 256, "maxNumSeqs": 128, "gpuMemoryUtilization": 0.85},
    }
    crds = of_kind(objects, "CustomResourceDefinition")
    assert {p["metadata"]["name"]: custom_resource_errors(p, crd_for(p, crds)) for p in of_kind(objects, "EnginePool")} == {
        "h100": [], "h200": [], "cpu": []}
    assert engine_settings(objects) == {"h100": ("bfloat16", 1024, 128, 0.85, "cuda"),
                                        "h200": ("float16", 1024, 256, 0.95, "cuda"),
                                        "cpu": ("auto", 256, 128, 0.85, "cpu")}


def overtake_limits(objects) -> dict[str, object]:
    """Each pool's spec.overtakeLimitS (absent: None) and the --overtake-limit-s its engine gets."""
    specs = {p["metadata"]["name"]: p["spec"].get("overtakeLimitS") for p in of_kind(objects, "EnginePool")}
    crds = of_kind(objects, "CustomResourceDefinition")
    assert all(custom_resource_errors(p, crd_for(p, crds)) == [] for p in of_kind(objects, "EnginePool"))
    flags = {}
    for deployment in engine_deployments(objects):
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        flags[deployment["metadata"]["name"].removesuffix("-engine")] = (
            build_parser().parse_args(args[1:]).overtake_limit_s if "--overtake-limit-s" in args else None)
    return {name: (specs[name], flags[name]) for name in specs}


def test_overtake_limit_0_is_written_and_reaches_the_engine_and_null_or_absent_is_not(tmp_path):
    assert yaml.safe_load((CHART / "values.yaml").read_text())["engine"]["overtakeLimitS"] is None
    assert set(overtake_limits(rendered(None)).values()) == {(None, None)}  # the engine's default, 5 s
    fcfs = ("  pools:\n"
            "    - {name: h100, nodeType: H100-80G, chunkSize: 8192}\n"
            "    - {name: h200, nodeType: H200, chunkSize: 8192, overtakeLimitS: 2.5}\n"
            "    - {name: cpu, nodeType: CPU, chunkSize: 256, overtakeLimitS: 0}\n")
    # engine's 0 (falsy in a Go template) is a setting: every pool without its own gets it
    assert overtake_limits(rendered_with("engine:\n  overtakeLimitS: 0\n" + fcfs, tmp_path)) == {
        "h100": (0, 0.0), "h200": (2.5, 2.5), "cpu": (0, 0.0)}
    # engine's null or no engine value: only the pools' own, a pool's 0 included
    for engine in ("engine:\n  overtakeLimitS: null\n", "engine:\n"):
        assert overtake_limits(rendered_with(engine + fcfs, tmp_path)) == {
            "h100": (None, None), "h200": (2.5, 2.5), "cpu": (0, 0.0)}
    assert overtake_limits(rendered_with("engine:\n  overtakeLimitS: 10\n" + fcfs, tmp_path))["h100"] == (10, 10.0)


def test_the_many_pools_value_set_renders_its_settings_valid_against_the_crd():
    objects = rendered(MANY_POOLS)
    crds = of_kind(objects, "CustomResourceDefinition")
    pools = of_kind(objects, "EnginePool")
    assert [custom_resource_errors(p, crd_for(p, crds)) for p in pools] == [[] for _ in pools]
    compute = compute_of_pools(objects)
    assert compute["h200"] == {"dtype": "bfloat16", "maxNumBatchedTokens": 1024, "maxNumSeqs": 256,
                               "gpuMemoryUtilization": 0.92}
    assert compute["cpu"] == {"dtype": "float32", "maxNumBatchedTokens": 256}
    assert compute["a100-40g"] == {"maxNumBatchedTokens": 1024}  # engine's, and nothing else
    settings = engine_settings(objects)
    assert settings["h200"][:4] == ("bfloat16", 1024, 256, 0.92)
    assert settings["cpu"][0] == "float32" and settings["cpu"][1:2] == (256,) and settings["cpu"][4] == "cpu"
