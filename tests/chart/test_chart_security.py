"""Every pod the chart runs, and every engine pod the operator starts for its pools, under
the restricted Pod Security Standard; NetworkPolicies that admit exactly: the gateway to
engines and chunker, the gateway, engines and operator to Redis, scrapers to metrics."""

import copy
import itertools

import pytest

from tests.helpers.helm_chart import (
    CI_VALUES,
    NAMESPACE,
    RELEASE,
    VALUE_SETS,
    engine_deployments,
    engine_workloads,
    named,
    of_kind,
    rendered,
    value_set_id,
)
from tests.helpers.network_policy import Pod, admits
from tests.helpers.pod_security import pod_specs, restricted_violations

value_sets = pytest.mark.parametrize("values", VALUE_SETS, ids=value_set_id)

GOOD_POD = {
    "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "seccompProfile": {"type": "RuntimeDefault"}},
    "containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                                      "capabilities": {"drop": ["ALL"]}}}],
    "volumes": [{"name": "tmp", "emptyDir": {}}],
}


def broken(change) -> dict:
    pod = copy.deepcopy(GOOD_POD)
    change(pod, pod["containers"][0]["securityContext"])
    return pod


@pytest.mark.parametrize("pod, complaint", [
    (broken(lambda p, c: p.update(hostNetwork=True)), "hostNetwork"),
    (broken(lambda p, c: p.update(hostPID=True)), "hostPID"),
    (broken(lambda p, c: p["volumes"].append({"name": "h", "hostPath": {"path": "/"}})), "hostPath"),
    (broken(lambda p, c: c.update(privileged=True)), "privileged"),
    (broken(lambda p, c: c.pop("allowPrivilegeEscalation")), "allowPrivilegeEscalation"),
    (broken(lambda p, c: c.update(capabilities={"drop": ["NET_RAW"]})), "drop ALL"),
    (broken(lambda p, c: c["capabilities"].update(add=["SYS_ADMIN"])), "adds capabilities"),
    (broken(lambda p, c: p["securityContext"].pop("runAsNonRoot")), "runAsNonRoot"),
    (broken(lambda p, c: c.update(runAsUser=0)), "runAsUser 0"),
    (broken(lambda p, c: p["securityContext"].pop("seccompProfile")), "seccompProfile"),
    (broken(lambda p, c: c.update(seccompProfile={"type": "Unconfined"})), "Unconfined"),
    (broken(lambda p, c: p["containers"][0].update(ports=[{"containerPort": 80, "hostPort": 80}])), "hostPort"),
    (broken(lambda p, c: p["securityContext"].update(sysctls=[{"name": "kernel.msgmax", "value": "1"}])), "sysctl"),
    (broken(lambda p, c: c.update(readOnlyRootFilesystem=False)), "readOnlyRootFilesystem"),
])
def test_the_checker_finds_each_kind_of_violation(pod, complaint):
    assert restricted_violations(GOOD_POD) == []
    assert any(complaint in problem for problem in restricted_violations(pod)), restricted_violations(pod)


@value_sets
def test_every_pod_passes_the_restricted_standard(values):
    objects = rendered(values)
    pods = pod_specs([*objects, *engine_workloads(objects)])
    assert len(pods) >= 5  # gateway, chunker, operator, Redis or not, and at least one pool
    assert {name: restricted_violations(spec) for name, spec in pods} == {name: [] for name, _ in pods}


@value_sets
def test_only_the_operator_gets_a_service_account_token(values):
    objects = rendered(values)
    tokens = {name: spec.get("automountServiceAccountToken", True)
              for name, spec in pod_specs([*objects, *engine_workloads(objects)])}
    assert {name for name, mounted in tokens.items() if mounted} == {"Deployment/k25-operator"}
    operator = named(objects, "Deployment", "k25-operator")["spec"]["template"]["spec"]
    assert operator["serviceAccountName"] == "k25-operator"


@value_sets
def test_every_writable_path_is_an_explicit_volume(values):
    objects = rendered(values)
    for name, spec in pod_specs([*objects, *engine_workloads(objects)]):
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        claims = {t["metadata"]["name"] for o in objects if o["kind"] == "StatefulSet"
                  for t in o["spec"].get("volumeClaimTemplates", [])}
        for container in spec["containers"]:
            writable = {m["mountPath"] for m in container.get("volumeMounts", []) if not m.get("readOnly")}
            assert "/tmp" in writable, f"{name}: no writable /tmp"
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes or mount["name"] in claims, f"{name}: {mount['name']} has no volume"
                if mount["mountPath"] == "/models":
                    assert mount["readOnly"] is True and volumes["models"]["persistentVolumeClaim"]["readOnly"] is True


# --- NetworkPolicies -----------------------------------------------------------------

OTHER = "other-team"
MONITORING = "monitoring"


def component_pod(component: str, namespace: str = NAMESPACE, release: str = RELEASE) -> Pod:
    return Pod(f"{release}/{component}@{namespace}", namespace,
               {"app.kubernetes.io/instance": release, "app.kubernetes.io/component": component},
               {"kubernetes.io/metadata.name": namespace})


def cast(objects) -> dict[str, tuple[Pod, set[int]]]:
    """Every pod that could try a connection, with the TCP ports it listens on."""
    pods = {}
    for obj in [*objects, *engine_deployments(objects)]:
        if obj["kind"] not in ("Deployment", "StatefulSet"):
            continue
        template = obj["spec"]["template"]
        component = template["metadata"]["labels"]["app.kubernetes.io/component"]
        ports = {p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
        pods[component] = (Pod(component, NAMESPACE, template["metadata"]["labels"],
                               {"kubernetes.io/metadata.name": NAMESPACE}), ports)
    outsiders = {
        "stranger": component_pod("web"),  # any other pod of the namespace
        "other-release-gateway": component_pod("gateway", release="k25-canary"),
        "other-namespace-gateway": component_pod("gateway", namespace=OTHER),
        "prometheus": Pod("prometheus", MONITORING, {"app.kubernetes.io/name": "prometheus"},
                          {"kubernetes.io/metadata.name": MONITORING}),
    }
    return pods | {name: (pod, set()) for name, pod in outsiders.items()}


def admitted(objects) -> set[tuple[str, str, int]]:
    policies = of_kind(objects, "NetworkPolicy")
    pods = cast(objects)
    return {(source, destination, port)
            for (source, (source_pod, _)), (destination, (destination_pod, ports)) in itertools.product(pods.items(), pods.items())
            for port in ports
            if source != destination and destination in ("engine", "chunker", "redis")
            and admits(policies, NAMESPACE, source_pod, destination_pod, port)}


def test_the_policy_model_follows_the_api_rules():
    web, gateway = component_pod("web"), component_pod("gateway")
    elsewhere = component_pod("gateway", namespace=OTHER)
    deny_all = {"metadata": {"name": "d"}, "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}
    from_gateways = {"metadata": {"name": "g"}, "spec": {"podSelector": {"matchLabels": {"app.kubernetes.io/component": "web"}},
                                                         "ingress": [{"from": [{"podSelector": {"matchLabels": {
                                                             "app.kubernetes.io/component": "gateway"}}}],
                                                             "ports": [{"port": 80}]}]}}
    assert admits([], NAMESPACE, gateway, web, 80)  # nothing selects it: open
    assert not admits([deny_all], NAMESPACE, gateway, web, 80)
    assert admits([from_gateways], NAMESPACE, gateway, web, 80)
    assert not admits([from_gateways], NAMESPACE, gateway, web, 81)
    assert not admits([from_gateways], NAMESPACE, elsewhere, web, 80)  # a podSelector alone: same namespace only
    assert admits([deny_all, from_gateways], NAMESPACE, gateway, web, 80)  # policies add up


@value_sets
def test_network_policies_admit_exactly_the_designed_paths(values):
    objects = rendered(values)
    has_redis = bool(of_kind(objects, "StatefulSet"))
    # the observability values admit only their own Prometheus (next test), not this one
    metrics_from = set() if value_set_id(values) == "observability" else {"prometheus"}
    expected = {("gateway", "engine", 5555), ("gateway", "chunker", 5600)}
    expected |= {(scraper, "engine", 9100) for scraper in metrics_from}
    expected |= {(scraper, "chunker", 9600) for scraper in metrics_from}
    if has_redis:
        expected |= {(client, "redis", 6379) for client in ("gateway", "engine", "operator")}
    assert admitted(objects) == expected


def test_observability_values_let_their_own_prometheus_scrape():
    [values] = [v for v in CI_VALUES if value_set_id(v) == "observability"]
    objects = rendered(values)
    prometheus = Pod("prometheus", "observability", {"app.kubernetes.io/name": "prometheus"},
                     {"kubernetes.io/metadata.name": "observability"})
    engine, _ = cast(objects)["engine"]
    policies = of_kind(objects, "NetworkPolicy")
    assert admits(policies, NAMESPACE, prometheus, engine, 9100)
    assert not admits(policies, NAMESPACE, prometheus, engine, 5555)


def test_the_pods_of_an_engine_over_two_nodes_reach_each_other_and_no_one_else_does():
    """torch.distributed's store (the master port), vLLM's message queues and NCCL take ports chosen
    at start: a group's pods admit each other on any port; the gateway reaches the leader's ZMQ
    port only; an engine on one node reaches neither."""
    objects = rendered(next(v for v in CI_VALUES if value_set_id(v) == "multi-node"))
    policies = of_kind(objects, "NetworkPolicy")
    workloads = {w["kind"]: w for w in engine_workloads(objects)}
    group = workloads["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]
    leader, worker = (Pod(role, NAMESPACE, group[f"{role}Template"]["metadata"]["labels"]) for role in ("leader", "worker"))
    single = Pod("one-node engine", NAMESPACE, workloads["Deployment"]["spec"]["template"]["metadata"]["labels"])
    gateway = component_pod("gateway")
    for port in (29501, 5555, 41234):
        assert admits(policies, NAMESPACE, worker, leader, port) and admits(policies, NAMESPACE, leader, worker, port)
        assert not admits(policies, NAMESPACE, single, leader, port) and not admits(policies, NAMESPACE, single, worker, port)
    assert admits(policies, NAMESPACE, gateway, leader, 5555) and not admits(policies, NAMESPACE, gateway, leader, 29501)
