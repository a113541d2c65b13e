"""The chart's parts fit each other and the code they run: CRDs and RBAC equal to k8s/,
command lines as the k25 CLI parses them, selectors that find the pods the operator
builds, Services that reach real ports, metrics the dashboard asks for that the code exports."""

import base64
import hashlib
import json
import re

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from engine.serve.metrics import EngineMetrics
from k25.cli import build_parser
from operators.deployment import models_claim_name
from operators.runtime import peering_name
from services.gateway.api_keys import ApiKeys
from services.gateway.metrics import GatewayMetrics
from services.gateway.tenant_limits import TenantLimits
from tests.helpers.helm_chart import (
    CHART,
    CI_VALUES,
    NAMESPACE,
    RELEASE,
    VALUE_SETS,
    engine_deployments,
    helm,
    named,
    of_kind,
    rendered,
    rendered_with,
    value_set_id,
)
from tests.helpers.network_policy import selects
from tests.helpers.paths import K8S

value_sets = pytest.mark.parametrize("values", VALUE_SETS, ids=value_set_id)


def ci(name: str):
    [path] = [v for v in CI_VALUES if value_set_id(v) == name]
    return path


def container(objects, kind: str, name: str) -> dict:
    return named(objects, kind, name)["spec"]["template"]["spec"]["containers"][0]


def env_of(c: dict) -> dict:
    return {e["name"]: e.get("value") for e in c.get("env", [])}


# --- one source of truth ------------------------------------------------------------------

def test_the_operators_cluster_role_has_exactly_the_rules_of_k8s_rbac(tmp_path):
    """With operator.watchNamespace all (the default is the release's namespace, test_chart_operator_scope.py)."""
    reference = next(d for d in yaml.safe_load_all((K8S / "rbac" / "operator.yaml").read_text()) if d["kind"] == "ClusterRole")
    objects = rendered_with("operator:\n  watchNamespace: all\n", tmp_path)
    assert named(objects, "ClusterRole", "k25-operator")["rules"] == reference["rules"]
    binding = named(objects, "ClusterRoleBinding", "k25-operator")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "k25-operator", "namespace": NAMESPACE}]
    assert [p["metadata"]["name"] for p in of_kind(objects, "ClusterKopfPeering")] == [peering_name(RELEASE)]


# --- command lines ----------------------------------------------------------------------

def test_the_components_run_the_agreed_command_lines():
    objects = rendered(None)
    assert container(objects, "Deployment", "k25-gateway")["args"] == [
        "k25", "gateway", "--host", "0.0.0.0", "--port", "8000", "--release", "k25",
        "--model", "/models/SmolLM2-135M-Instruct.Q4_1.gguf", "--served-model-name", "SmolLM2-135M-Instruct.Q4_1",
        "--chunker-address", "k25-chunker:5600", "--prefix-index-max-blocks", "262144",
        "--max-document-passages", "256", "--document-passages-read", "4", "--max-document-bytes", "4194304",
        "--max-tenant-document-bytes", "67108864", "--max-tenant-documents", "1000", "--document-ttl-s", "604800",
        "--body-timeout-s", "30", "--max-body-bytes-in-flight", "536870912", "--request-timeout-s", "600", "--pool", "a100-40g=2048", "--pool", "a100-80g=4096", "--pool", "h100-80g=8192"]
    assert container(objects, "Deployment", "k25-chunker")["args"] == [
        "k25", "chunker", "--zmq-port", "5600", "--metrics-port", "9600", "--model", "/models/SmolLM2-135M-Instruct.Q4_1.gguf"]
    assert container(objects, "Deployment", "k25-operator")["args"] == [
        "k25", "operator", "--release", "k25", "--namespace", NAMESPACE, "--allowed-image", "k25-engine",
        "--allowed-image", "k25-engine-vllm"]


@pytest.mark.parametrize("component", ["gateway", "chunker", "operator", "engine"])
def test_the_k25_cli_accepts_each_command_line(component):
    objects = rendered(ci("ingress"))  # the gateway with --api-keys-file too
    if component == "engine":
        args = engine_deployments(objects)[0]["spec"]["template"]["spec"]["containers"][0]["args"]
        args = [a.replace("$(POD_IP)", "10.1.2.3") for a in args]
    else:
        args = container(objects, "Deployment", f"k25-{component}")["args"]
    assert args[0] == "k25"
    parsed = build_parser().parse_args(args[1:])
    assert parsed.command == component
    if component == "engine":
        assert (parsed.release, parsed.advertise_host, parsed.device) == (RELEASE, "10.1.2.3", "cuda")
    elif component == "gateway":
        assert parsed.served_model_name == "SmolLM2-135M-Instruct.Q4_1"
    elif component == "chunker":
        assert (parsed.zmq_port, parsed.metrics_port) == (5600, 9600)
    else:
        assert parsed.release == RELEASE


@value_sets
def test_the_gateway_knows_every_pool_so_that_a_pool_at_zero_gets_its_demand_counted(values):
    objects = rendered(values)
    parsed = build_parser().parse_args(container(objects, "Deployment", "k25-gateway")["args"][1:])
    assert sorted(parsed.pools) == sorted((p["metadata"]["name"], p["spec"]["chunkSize"]) for p in of_kind(objects, "EnginePool"))


def test_an_external_redis_reaches_every_component_and_the_engines():
    objects = rendered(ci("external-redis"))
    url = "redis://redis-master.data.svc.cluster.local:6379/2"
    assert not of_kind(objects, "StatefulSet")
    secret = named(objects, "Secret", "k25-redis")
    assert base64.b64decode(secret["data"]["redis-url"]).decode() == url and "redis-password" not in secret["data"]
    reads = {"name": "K25_REDIS_URL", "valueFrom": {"secretKeyRef": {"name": secret["metadata"]["name"], "key": "redis-url"}}}
    for c in [container(objects, "Deployment", name) for name in ("k25-gateway", "k25-operator")] + [
            d["spec"]["template"]["spec"]["containers"][0] for d in engine_deployments(objects)]:
        assert reads in c["env"], c["name"]


# --- images: one per component -----------------------------------------------------------------

def images_with(*sets: str) -> dict[str, tuple[str, str]]:
    """component -> (image, pull policy) as helm renders them with these --set values; the
    engines' image is what the EnginePools name."""
    result = helm("template", RELEASE, str(CHART), *[a for s in sets for a in ("--set", s)])
    assert result.returncode == 0, result.stderr
    objects = [d for d in yaml.safe_load_all(result.stdout) if d]
    images = {}
    for component in ("gateway", "chunker", "operator"):
        c = container(objects, "Deployment", f"{RELEASE}-{component}")
        images[component] = (c["image"], c["imagePullPolicy"])
    [images["engine"]] = {(p["spec"]["image"], "") for p in of_kind(objects, "EnginePool")}
    return images


def test_each_component_runs_its_own_image():
    assert images_with() == {"gateway": ("k25-gateway:0.1.0", "IfNotPresent"), "chunker": ("k25-chunker:0.1.0", "IfNotPresent"),
                             "operator": ("k25-operator:0.1.0", "IfNotPresent"), "engine": ("k25-engine:0.1.0", "")}


def test_image_names_the_registry_and_tag_of_every_component_image_as_before():
    images = images_with("image.repository=registry.example.com:5000/k25", "image.tag=0.2.0", "image.pullPolicy=Always")
    assert images == {"gateway": ("registry.example.com:5000/k25-gateway:0.2.0", "Always"),
                      "chunker": ("registry.example.com:5000/k25-chunker:0.2.0", "Always"),
                      "operator": ("registry.example.com:5000/k25-operator:0.2.0", "Always"),
                      "engine": ("k25-engine:0.1.0", "")}  # engineImage is set on its own, as before


def test_a_components_own_image_wins():
    images = images_with("image.tag=0.2.0", "gateway.image.repository=registry.example.com/gw", "chunker.image.tag=c1",
                         "operator.image.pullPolicy=Never", "engineImage.repository=registry.example.com/engine")
    assert images == {"gateway": ("registry.example.com/gw:0.2.0", "IfNotPresent"), "chunker": ("k25-chunker:c1", "IfNotPresent"),
                      "operator": ("k25-operator:0.2.0", "Never"), "engine": ("registry.example.com/engine:0.1.0", "")}


# --- API keys ------------------------------------------------------------------------------

def test_api_key_entries_and_tenant_limits_become_a_secret_the_gateway_can_load(tmp_path):
    objects = rendered(ci("ingress"))
    gateway = named(objects, "Deployment", "k25-gateway")["spec"]["template"]["spec"]
    args = gateway["containers"][0]["args"]
    keys_file = args[args.index("--api-keys-file") + 1]
    [mount] = [m for m in gateway["containers"][0]["volumeMounts"] if keys_file.startswith(m["mountPath"] + "/")]
    [volume] = [v for v in gateway["volumes"] if v["name"] == mount["name"]]
    secret = named(objects, "Secret", volume["secret"]["secretName"])
    path = tmp_path / "keys.json"
    path.write_text(secret["stringData"][keys_file.rsplit("/", 1)[1]])
    keys = ApiKeys.from_file(str(path))
    assert keys.caller_of("k25-test-key-acme").tenant == "acme"
    assert keys.caller_of("k25-test-key-globex").tenant == "globex"
    assert keys.caller_of("k25-test-key-nobody") is None
    assert keys.caller_of("k25-test-key-compliance").admin and not keys.caller_of("k25-test-key-acme").admin
    assert keys.limits_of("acme") == TenantLimits(max_concurrent_requests=8, tokens_per_minute=200000)
    assert keys.limits_of("globex") is None
    assert hashlib.sha256(b"k25-test-key-acme").hexdigest() in secret["stringData"]["keys.json"]


def test_without_keys_the_gateway_gets_no_keys_file():
    objects = rendered(None)
    assert "--api-keys-file" not in container(objects, "Deployment", "k25-gateway")["args"]
    # the Redis credentials (the default user's and each part's) and the CURVE key only
    assert sorted(s["metadata"]["name"] for s in of_kind(objects, "Secret")) == [
        "k25-redis", "k25-redis-engine", "k25-redis-gateway", "k25-redis-operator", "k25-transport"]


# --- pools, the operator's pods, and what selects them -----------------------------------------

def test_the_default_pools_are_the_three_profiled_node_types_like_the_k8s_examples():
    examples = {e["spec"]["nodeType"]: e["spec"] for e in
                (yaml.safe_load(p.read_text()) for p in (K8S / "examples").glob("enginepool-*.yaml"))}
    pools = {p["spec"]["nodeType"]: p["spec"] for p in of_kind(rendered(None), "EnginePool")}
    assert {t: s["maxChunkPerGpu"] for t, s in pools.items()} == {"A100-40G": 2, "A100-80G": 4, "H100-80G": 8}
    for node_type, spec in pools.items():
        for field in ("nodeSelector", "tolerations", "chunkSize", "gpusPerReplica", "targetQPSPerReplica"):
            assert spec[field] == examples[node_type][field], (node_type, field)
        assert spec["targetQPSPerReplica"] == 80 and spec["image"] == "k25-engine:0.1.0"


@value_sets
def test_every_service_reaches_named_ports_of_the_pods_it_selects(values):
    objects = rendered(values)
    templates = [o["spec"]["template"] for o in [*objects, *engine_deployments(objects)]
                 if o["kind"] in ("Deployment", "StatefulSet")]
    for service in of_kind(objects, "Service"):
        backends = [t for t in templates if selects({"matchLabels": service["spec"]["selector"]}, t["metadata"]["labels"])]
        assert backends, f"Service {service['metadata']['name']} selects no pod"
        for port in service["spec"]["ports"]:
            for template in backends:
                names = {p.get("name") for c in template["spec"]["containers"] for p in c.get("ports", [])}
                assert port["targetPort"] in names, (service["metadata"]["name"], port)


@value_sets
def test_the_models_claim_is_the_one_the_operator_mounts_in_engines(values):
    objects = rendered(values)
    claims = {o["metadata"]["name"] for o in of_kind(objects, "PersistentVolumeClaim")}
    engine_claims = {v["persistentVolumeClaim"]["claimName"] for d in engine_deployments(objects)
                     for v in d["spec"]["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v}
    # besides the chart's claim, only an adapters claim that the values name (engine.lora.claimName)
    named_claims = {p["spec"]["lora"]["claimName"] for p in of_kind(objects, "EnginePool")
                    if "claimName" in p["spec"].get("lora", {})}
    assert engine_claims <= claims | named_claims
    if claims:
        assert claims == {models_claim_name(RELEASE)}
        for name in ("k25-gateway", "k25-chunker"):
            volumes = named(objects, "Deployment", name)["spec"]["template"]["spec"]["volumes"]
            assert {"name": "models", "persistentVolumeClaim": {"claimName": "k25-models", "readOnly": True}} in volumes


def test_the_cpu_dev_values_ask_for_no_gpu_and_no_volume():
    objects = rendered(ci("cpu-dev"))
    [engine] = engine_deployments(objects)
    pod = engine["spec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in pod["containers"][0]["resources"].get("limits", {}) and pod["tolerations"] == []
    args = pod["containers"][0]["args"]
    assert args[args.index("--device") + 1] == "cpu"
    assert pod["containers"][0]["image"] == "k25-engine-cpu:0.1.0"  # the CPU engine image
    assert not of_kind(objects, "PersistentVolumeClaim")
    [redis] = of_kind(objects, "StatefulSet")
    assert "volumeClaimTemplates" not in redis["spec"]
    assert {"name": "data", "emptyDir": {}} in redis["spec"]["template"]["spec"]["volumes"]


def test_default_redis_keeps_its_data_on_a_claim():
    [redis] = of_kind(rendered(None), "StatefulSet")
    assert [t["metadata"]["name"] for t in redis["spec"]["volumeClaimTemplates"]] == ["data"]


# --- gateway scaling and exposure ----------------------------------------------------------------

def test_the_hpa_scales_the_gateway_on_cpu_and_owns_its_replicas():
    objects = rendered(None)
    [hpa] = of_kind(objects, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "k25-gateway"}
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    assert "replicas" not in named(objects, "Deployment", "k25-gateway")["spec"]
    assert named(objects, "Deployment", "k25-gateway")["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"]
    dev = rendered(ci("cpu-dev"))
    assert not of_kind(dev, "HorizontalPodAutoscaler") and named(dev, "Deployment", "k25-gateway")["spec"]["replicas"] == 1


def test_the_gateway_probes_healthz_and_readyz_on_its_port():
    gateway = container(rendered(None), "Deployment", "k25-gateway")
    assert gateway["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert gateway["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert gateway["ports"] == [{"name": "http", "containerPort": 8000}]


def test_the_chunker_liveness_probe_asks_its_serving_loop():
    """TCP on the metrics port passes while the serving loop is stuck on one document; /healthz does not."""
    chunker = container(rendered(None), "Deployment", "k25-chunker")
    assert chunker["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert {"name": "metrics", "containerPort": 9600} in chunker["ports"]
    args = build_parser().parse_args(chunker["args"][1:])
    assert args.metrics_port == 9600


def test_the_ingress_sends_its_host_to_the_gateway_service_over_tls():
    objects = rendered(ci("ingress"))
    [ingress] = of_kind(objects, "Ingress")
    [rule] = ingress["spec"]["rules"]
    backend = rule["http"]["paths"][0]["backend"]["service"]
    assert rule["host"] == "llm.example.com" and backend == {"name": "k25-gateway", "port": {"name": "http"}}
    assert ingress["spec"]["tls"] == [{"hosts": ["llm.example.com"], "secretName": "llm-example-com-tls"}]
    assert named(objects, "Service", "k25-gateway")["spec"]["ports"][0]["name"] == "http"


# --- tracing and monitoring ------------------------------------------------------------------------

def traced_containers(objects) -> dict[str, dict]:
    """Every K25 process's container, the engines the operator builds included."""
    chart = {o["metadata"]["name"]: o["spec"]["template"]["spec"]["containers"][0] for o in of_kind(objects, "Deployment")
             if o["spec"]["template"]["spec"]["containers"][0]["args"][:1] == ["k25"]}
    return chart | {d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0] for d in engine_deployments(objects)}


def test_every_component_the_engines_included_exports_traces_to_the_collectors_otlp_http_port():
    objects = rendered(ci("observability"))
    collector = named(objects, "Service", "k25-otel-collector")
    # common/tracing.py exports OTLP over HTTP, which the collector takes on its otlp-http port
    assert {"name": "otlp-http", "port": 4318, "targetPort": "otlp-http"} in collector["spec"]["ports"]
    config = yaml.safe_load(named(objects, "ConfigMap", "k25-otel-collector")["data"]["config.yaml"])
    assert config["receivers"]["otlp"]["protocols"]["http"]["endpoint"] == "0.0.0.0:4318"
    containers = traced_containers(objects)
    assert {"k25-gateway", "k25-chunker", "k25-operator", "h100-80g-engine"} <= set(containers)
    for name, c in containers.items():
        assert env_of(c).get("OTEL_EXPORTER_OTLP_ENDPOINT") == "http://k25-otel-collector:4318", name
        assert "OTEL_SERVICE_NAME" not in env_of(c), name  # each process names itself (k25-gateway, k25-engine, ...)
    assert config["exporters"]["otlp"]["endpoint"] == "tempo.observability.svc.cluster.local:4317"
    assert config["service"]["pipelines"]["traces"]["exporters"] == ["otlp"]


def test_without_tracing_no_component_gets_an_endpoint_and_with_one_every_component_does(tmp_path):
    assert not [n for n, c in traced_containers(rendered(None)).items() if "OTEL_EXPORTER_OTLP_ENDPOINT" in env_of(c)]
    values = tmp_path / "values.yaml"
    values.write_text("tracing:\n  otlpEndpoint: https://otlp.example.com:4318\n")
    result = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--values", str(values))
    assert result.returncode == 0, result.stderr
    objects = tuple(d for d in yaml.safe_load_all(result.stdout) if d)
    assert not [c for c in of_kind(objects, "ConfigMap") if "otel" in c["metadata"]["name"]]  # no collector
    endpoints = {n: env_of(c).get("OTEL_EXPORTER_OTLP_ENDPOINT") for n, c in traced_containers(objects).items()}
    assert set(endpoints.values()) == {"https://otlp.example.com:4318"} and len(endpoints) == 6


def test_the_service_monitor_scrapes_gateway_chunker_and_engines_with_their_pool():
    objects = rendered(ci("observability"))
    [monitor] = of_kind(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    scraped = {s["metadata"]["name"]: {p["name"] for p in s["spec"]["ports"]} for s in of_kind(objects, "Service")
               if selects(monitor["spec"]["selector"], s["metadata"]["labels"])}
    assert set(scraped) == {"k25-gateway", "k25-chunker", "k25-engine-metrics"}
    endpoint_ports = {e["port"] for e in monitor["spec"]["endpoints"]}
    assert all(ports & endpoint_ports for ports in scraped.values())
    [relabel] = next(e for e in monitor["spec"]["endpoints"] if e["port"] == "metrics")["relabelings"]
    assert relabel == {"sourceLabels": ["__meta_kubernetes_pod_label_k25_io_pool"], "targetLabel": "pool"}


def exported_series() -> dict[str, set[str]]:
    """Series name -> label names, for every metric the engine and the gateway define."""
    suffixes = {"counter": ["_total"], "gauge": [""], "histogram": ["_bucket", "_sum", "_count"]}
    series = {}
    for metrics in (EngineMetrics(), GatewayMetrics()):
        for metric in vars(metrics).values():
            if isinstance(metric, MetricWrapperBase):
                for suffix in suffixes[metric._type]:
                    series[metric._name + suffix] = set(metric._labelnames) | ({"le"} if suffix == "_bucket" else set())
    return series


def test_the_grafana_dashboard_shows_the_serving_figures_from_exported_metrics():
    [config_map] = [c for c in of_kind(rendered(None), "ConfigMap") if c["metadata"]["name"] == "k25-dashboard"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["k25.json"])
    assert dashboard == json.loads((CHART / "dashboards" / "k25.json").read_text())
    titles = " | ".join(p["title"] for p in dashboard["panels"])
    for shown in ("Requests per second by pool", "replicas", "Time to first token p95", "Inter-token latency p95",
                  "KV cache", "503"):
        assert shown in titles
    series = exported_series()
    # engine series get `pool` from the ServiceMonitor's relabelling (previous test)
    scrape_labels = {"pool", "namespace"}
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            for name in re.findall(r"\bk25_[a-z0-9_]+", target["expr"]):
                assert name in series, f"{panel['title']}: {name} is not exported"
                used = set(re.findall(r"by \(([^)]*)\)", target["expr"])[0].replace(" ", "").split(","))
                assert used <= series[name] | scrape_labels, (panel["title"], name, used)


# --- what the user reads -----------------------------------------------------------------------

@pytest.mark.parametrize("values, expected", [
    (None, ["kubectl -n serving port-forward service/k25-gateway 8000:8000", "kubectl -n serving get enginepools -w",
            "a100-40g, a100-80g, h100-80g", "claim k25-models", '"model": "SmolLM2-135M-Instruct.Q4_1"']),
    ("ingress", ["https://llm.example.com/v1/models", "Authorization: Bearer"]),
    ("observability", ["Traces of every component, the engines included, go to http://k25-otel-collector:4318"]),
    ("lora", ['"model": "smollm2"', "contract-review on pool h100-80g: v1 stable, v2 canary",
              "summaries on pool l40s: 2024.1 stable, 2025.1 canary", "get adapterrollouts -w",
              "Pool l40s loads LoRA adapters from the claim lora-adapters (mounted at /srv/lora)"]),
])
def test_the_notes_say_how_to_reach_the_gateway_and_watch_the_pools(values, expected):
    args = [] if values is None else ["--values", str(ci(values))]
    result = helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client", *args)
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    for line in expected:
        assert line in notes
