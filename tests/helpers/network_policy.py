"""Which TCP connections a set of NetworkPolicies admits, by the rules of networking.k8s.io/v1
(ingress side): a pod no Ingress policy selects takes any connection; a selected pod takes
one that some rule of some selecting policy allows. Peers are pods (podSelector,
namespaceSelector or both); ipBlock and named ports are not used by the chart and are refused."""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Pod:
    name: str
    namespace: str
    labels: dict = field(default_factory=dict)
    namespace_labels: dict = field(default_factory=dict)


def selects(selector: dict | None, labels: dict) -> bool:
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        held = {"In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values,
                "Exists": key in labels, "DoesNotExist": key not in labels}[operator]
        if not held:
            return False
    return True


def _peer_admits(peer: dict, policy_namespace: str, source: Pod) -> bool:
    if "ipBlock" in peer:
        raise ValueError("ipBlock peers are not modelled")
    if "namespaceSelector" in peer:
        in_namespace = selects(peer["namespaceSelector"], source.namespace_labels)
    else:
        in_namespace = source.namespace == policy_namespace
    pod_ok = selects(peer["podSelector"], source.labels) if "podSelector" in peer else True
    return in_namespace and pod_ok


def _port_admits(rule: dict, port: int) -> bool:
    ports = rule.get("ports")
    if not ports:
        return True
    for entry in ports:
        if not isinstance(entry.get("port", port), int):
            raise ValueError("named ports are not modelled")
        if entry.get("protocol", "TCP") == "TCP" and entry.get("port", port) <= port <= entry.get("endPort", entry.get("port", port)):
            return True
    return False


def admits(policies: list[dict], namespace: str, source: Pod, destination: Pod, port: int) -> bool:
    """Whether `source` may open `port` on `destination`, under `policies`, all of them in `namespace`."""
    selecting = [p for p in policies
                 if namespace == destination.namespace
                 and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
                 and selects(p["spec"]["podSelector"], destination.labels)]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            peers = rule.get("from")
            if (not peers or any(_peer_admits(peer, namespace, source) for peer in peers)) and _port_admits(rule, port):
                return True
    return False
