"""LoRA through the chart: engine.lora and each pool's own `lora` become the EnginePools'
spec.lora, which the operator turns into `k25 engine` flags and a read-only adapters mount;
adapterRollouts become AdapterRollouts that the operator's own checks accept, each on a
pool whose engines load adapters."""

import yaml

from k25.cli import build_parser
from operators.rollout_spec import parse_rollout_spec
from tests.helpers.helm_chart import CHART, LORA_VALUES, engine_deployments, named, of_kind, rendered

LORA = yaml.safe_load(LORA_VALUES.read_text())


def engine_pods(objects) -> dict[str, dict]:
    return {d["metadata"]["name"].removesuffix("-engine"): d["spec"]["template"]["spec"] for d in engine_deployments(objects)}


def adapter_mount(pod: dict) -> tuple[str, str] | None:
    """(mount path, claim) of the adapter root the engine is told, or None without adapters."""
    engine = pod["containers"][0]
    args = build_parser().parse_args(engine["args"][1:])
    if not args.max_loras:
        assert args.adapter_root is None
        return None
    [mount] = [m for m in engine["volumeMounts"] if m["mountPath"] == args.adapter_root]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert mount["readOnly"] is True and volume["persistentVolumeClaim"]["readOnly"] is True
    return mount["mountPath"], volume["persistentVolumeClaim"]["claimName"]


def test_by_default_no_pool_loads_adapters_and_no_rollout_is_made():
    objects = rendered(None)
    assert yaml.safe_load((CHART / "values.yaml").read_text())["engine"]["lora"]["maxLoras"] == 0
    assert not [p["metadata"]["name"] for p in of_kind(objects, "EnginePool") if "lora" in p["spec"]]
    assert not of_kind(objects, "AdapterRollout")
    assert {name: adapter_mount(pod) for name, pod in engine_pods(objects).items()} == {
        "a100-40g": None, "a100-80g": None, "h100-80g": None}


def test_engine_lora_is_every_pools_default_and_a_pool_overrides_any_key_even_to_off():
    pools = {p["metadata"]["name"]: p["spec"].get("lora") for p in of_kind(rendered(LORA_VALUES), "EnginePool")}
    assert pools == {
        # engine.lora over the chart's defaults; no claimName: the operator mounts the models claim
        "h100-80g": {"maxLoras": 4, "maxCpuLoras": 16, "maxLoraRank": 64, "kernel": "torch", "adapterRoot": "/adapters"},
        "a100-40g": None,  # its own maxLoras: 0
        "l40s": {"maxLoras": 2, "maxCpuLoras": 16, "maxLoraRank": 16, "kernel": "triton", "adapterRoot": "/srv/lora",
                 "claimName": "lora-adapters"},
    }


def test_the_engines_get_the_lora_flags_and_their_adapter_claim_read_only_at_the_adapter_root():
    pods = engine_pods(rendered(LORA_VALUES))
    assert {name: adapter_mount(pod) for name, pod in pods.items()} == {
        "h100-80g": ("/adapters", "k25-models"), "a100-40g": None, "l40s": ("/srv/lora", "lora-adapters")}
    l40s = build_parser().parse_args(pods["l40s"]["containers"][0]["args"][1:])
    assert (l40s.max_loras, l40s.max_cpu_loras, l40s.max_lora_rank, l40s.lora_kernel, l40s.device) == (
        2, 16, 16, "triton", "cuda")
    assert l40s.redis_url  # with Redis, the engines follow the rollout state


def test_each_rollout_is_rendered_as_written_and_accepted_by_the_operator():
    objects = rendered(LORA_VALUES)
    lora_pools = {p["metadata"]["name"] for p in of_kind(objects, "EnginePool") if "lora" in p["spec"]}
    rollouts = {r["metadata"]["name"]: r for r in of_kind(objects, "AdapterRollout")}
    assert set(rollouts) == {entry["name"] for entry in LORA["adapterRollouts"]}
    for entry in LORA["adapterRollouts"]:
        spec = rollouts[entry["name"]]["spec"]
        assert spec == {k: v for k, v in entry.items() if k != "name"} | {"adapter": entry.get("adapter", entry["name"])}
        parsed = parse_rollout_spec(spec)
        assert parsed.pool in lora_pools
    assert parse_rollout_spec(rollouts["filings-summary"]["spec"]).adapter == "summaries"
    assert named(objects, "AdapterRollout", "contract-review")["metadata"]["labels"]["app.kubernetes.io/instance"] == "k25"
