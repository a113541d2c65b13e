"""The LeaderWorkerSets the operator builds, checked and read as the cluster would.

- `api_errors`: the object against the LeaderWorkerSet v1 API (leaderworkerset.x-k8s.io/v1),
  its own fields by a JSON schema written here by hand from the API's reference (the Go types of
  api/leaderworkerset/v1: required fields, enums, bounds, no unknown fields), and its two pod
  templates against Kubernetes' own PodTemplateSpec schema (kubernetes-validate, strict). The
  CRD's openAPIV3Schema itself is not used: no package of PyPI, npm or Debian ships
  LeaderWorkerSet's CRD or a JSON schema of it (looked for: leaderworkerset, lws, multi-node
  inference in the registries' package lists; @kubernetes-models/* on npm has no LWS package;
  the kserve, llm-d-planner, aibrix, ai-dynamo, kalavai-client, llmaz and kubetorch wheels
  carry none), and the project installs what it checks against only from those registries.
- `container_args`: a pod's `k25 engine` arguments after the kubelet's $(NAME) expansion, with
  the variables LeaderWorkerSet's controller adds to every container (LWS_LEADER_ADDRESS,
  LWS_GROUP_SIZE, LWS_WORKER_INDEX) and the pod's IP.
"""

import re

import jsonschema
import kubernetes_validate.utils as kv

# the variables LeaderWorkerSet's controller puts first in every container's environment
LWS_VARIABLES = ("LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX")
INT_OR_STRING = {"anyOf": [{"type": "integer"}, {"type": "string"}]}
LEADER_WORKER_SET_V1 = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "leaderworkerset.x-k8s.io/v1"},
        "kind": {"const": "LeaderWorkerSet"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["leaderWorkerTemplate"],
            "properties": {
                "replicas": {"type": "integer", "minimum": 0, "maximum": 1000000},
                "leaderWorkerTemplate": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["workerTemplate"],
                    "properties": {
                        "leaderTemplate": {"type": "object"},  # PodTemplateSpecs: checked by Kubernetes' schema
                        "workerTemplate": {"type": "object"},
                        "size": {"type": "integer", "minimum": 1},
                        "restartPolicy": {"enum": ["Default", "RecreateGroupOnPodRestart", "RecreateGroupAfterStart",
                                                   "None"]},
                        "subGroupPolicy": {"type": "object", "additionalProperties": False, "properties": {
                            "subGroupPolicyType": {"enum": ["LeaderWorker", "LeaderExcluded"]},
                            "subGroupSize": {"type": "integer", "minimum": 1}}},
                        "volumeClaimTemplates": {"type": "array", "items": {"type": "object"}},
                        "persistentVolumeClaimRetentionPolicy": {"type": "object"},
                    },
                },
                "rolloutStrategy": {"type": "object", "additionalProperties": False, "required": ["type"], "properties": {
                    "type": {"enum": ["RollingUpdate"]},
                    "rollingUpdateConfiguration": {"type": "object", "additionalProperties": False, "properties": {
                        "partition": {"type": "integer", "minimum": 0}, "maxUnavailable": INT_OR_STRING,
                        "maxSurge": INT_OR_STRING}}}},
                "startupPolicy": {"enum": ["LeaderCreated", "LeaderReady"]},
                "networkConfig": {"type": "object", "additionalProperties": False, "required": ["subdomainPolicy"],
                                  "properties": {"subdomainPolicy": {"enum": ["Shared", "UniquePerReplica"]}}},
            },
        },
        "status": {"type": "object"},
    },
}


def api_errors(lws: dict, kubernetes_version: str) -> list[str]:
    """What the API server would refuse in this LeaderWorkerSet; [] when it takes it."""
    validator = jsonschema.Draft202012Validator(LEADER_WORKER_SET_V1)
    errors = [f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in validator.iter_errors(lws)]
    group = lws.get("spec", {}).get("leaderWorkerTemplate", {})
    for role in ("leaderTemplate", "workerTemplate"):
        if role in group:
            wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": role.lower()},
                       "template": group[role]}
            try:
                kv.validate(wrapped, kubernetes_version, strict=True)
            except kv.ValidationError as exc:
                errors.append(f"spec.leaderWorkerTemplate.{role}.{'.'.join(map(str, exc.path))}: {exc.message}")
    return errors


def pod_template(lws: dict, role: str) -> dict:
    """role: leader or worker."""
    return lws["spec"]["leaderWorkerTemplate"][f"{role}Template"]


def lws_environment(lws: dict, group: int, worker: int, namespace: str = "serving") -> dict[str, str]:
    """What LeaderWorkerSet's controller tells pod `worker` of group `group` (the leader is worker 0)."""
    name = lws["metadata"]["name"]
    return {"LWS_LEADER_ADDRESS": f"{name}-{group}.{name}.{namespace}",
            "LWS_GROUP_SIZE": str(lws["spec"]["leaderWorkerTemplate"]["size"]), "LWS_WORKER_INDEX": str(worker)}


def container_args(template: dict, lws_env: dict[str, str], pod_ip: str = "10.1.2.3") -> list[str]:
    """The engine container's arguments as the kubelet runs them: $(NAME) replaced by the variable
    of the container's environment, the pod IP for status.podIP and LeaderWorkerSet's variables
    first (a name the environment lacks stays as written, as the kubelet leaves it)."""
    [container] = template["spec"]["containers"]
    env = dict(lws_env)
    for entry in container.get("env", []):
        if entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
            env[entry["name"]] = pod_ip
        elif "value" in entry:
            env[entry["name"]] = _expand(entry["value"], env)
    return [_expand(arg, env) for arg in container["args"]]


def _expand(text: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), text)
