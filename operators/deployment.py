"""The engine Deployment of one EnginePool, as a manifest built from the pool's spec.

Stopping an engine: on SIGTERM it leaves the Redis registry at once, refuses new work with a
code the gateway retries elsewhere, and finishes its running requests within the pool's drain
timeout. The pod's grace period is that timeout plus a margin for cancelling the rest and
exiting. There is no preStop hook: gateways find engines in the registry, not through a
Service's endpoints, so there is no endpoint update to wait for; a preStop sleep would only
keep the engine in the registry, taking new requests, for longer.

Probes: the startup probe (the ZMQ port open, up to ten minutes) covers loading the model;
until it succeeds the kubelet runs no liveness probe, so the liveness probe needs no initial
delay. It then asks the engine's /healthz, which answers 503 once steps keep failing or one
has stalled, and the kubelet restarts the engine after three such answers in a row.
"""

import os
from collections.abc import Mapping

from common.engine_settings import engine_args as settings_args
from common.zmq_curve import ENV as CURVE_ENV
from common.zmq_curve import NEXT_ENV as CURVE_NEXT_ENV
from common.zmq_curve import PREVIOUS_ENV as CURVE_PREVIOUS_ENV
from operators.config import (
    CURVE_NEXT_KEY_KEY,
    CURVE_PREVIOUS_KEY_KEY,
    CURVE_SECRET_KEY_KEY,
    REDIS_CA_DIR,
    REDIS_URL_KEY,
    OperatorConfig,
)
from operators.engine_pod import container_resources, spread_over_nodes
from operators.pool_spec import MODELS_MOUNT, SCRATCH_MOUNT, EnginePoolSpec
from operators.pool_upgrade import TEMPLATE_HASH, template_hash

POOL_LABEL = "k25.io/pool"
ZMQ_PORT = 5555
METRICS_PORT = 9100
# GPU engines load weights for minutes: give the start that long before liveness counts
STARTUP_PROBE = {"tcpSocket": {"port": ZMQ_PORT}, "periodSeconds": 10, "failureThreshold": 60}
LIVENESS_PROBE = {"httpGet": {"path": "/healthz", "port": "metrics"}, "periodSeconds": 10, "timeoutSeconds": 5,
                  "failureThreshold": 3}
READINESS_PROBE = {"tcpSocket": {"port": ZMQ_PORT}, "periodSeconds": 5}
# vLLM's tensor-parallel workers pass each step's inputs through shared memory, more than the 64 MiB
# /dev/shm a container gets; the volume's memory counts against the pod's memory limit
SHARED_MEMORY = {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}}
# after the drain timeout: cancelling what still runs, telling the gateways, and exiting
DRAIN_GRACE_MARGIN_S = 15
# the models PVC of the Helm chart (`{release}-models`) is mounted read-only at MODELS_MOUNT
# where pools name their model by path; a model given by name (smollm2-135m, tiny-random) is
# in the image. The operator's own OTLP endpoint goes to the engines it starts, so that their
# spans join the gateway's traces (common/tracing.py reads these variables).
TRACING_ENV = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
# the restricted Pod Security Standard: the image's non-root user (docker/*.Dockerfile),
# no privilege escalation, no capabilities, read-only root with /tmp as the one scratch space
ENGINE_UID = 10001
POD_SECURITY_CONTEXT = {"runAsNonRoot": True, "runAsUser": ENGINE_UID, "runAsGroup": ENGINE_UID,
                        "fsGroup": ENGINE_UID, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY_CONTEXT = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                              "capabilities": {"drop": ["ALL"]}}


def workload_name(pool_name: str) -> str:
    """The pool's Deployment, or its LeaderWorkerSet (operators/leader_worker_set.py)."""
    return f"{pool_name}-engine"


def pod_labels(pool_name: str, release: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "k25-engine", "app.kubernetes.io/instance": release,
            "app.kubernetes.io/component": "engine", POOL_LABEL: pool_name}


def pod_selector(pool_name: str) -> str:
    return f"{POOL_LABEL}={pool_name}"


def models_claim_name(release: str) -> str:
    return f"{release}-models"


def termination_grace_s(spec: EnginePoolSpec) -> int:
    return spec.drain_timeout_s + DRAIN_GRACE_MARGIN_S


def engine_args(spec: EnginePoolSpec, pool_name: str, release: str) -> list[str]:
    """The Redis URL is not among them: the engine reads it from K25_REDIS_URL (engine_env)."""
    args = ["k25", "engine", "--model", spec.model, "--chunk-size", str(spec.chunk_size)]
    if spec.max_chunk_per_gpu is not None:  # else the node type's default, or as many as fit
        args += ["--max-chunk-per-gpu", str(spec.max_chunk_per_gpu)]
    if spec.expected_chunks_per_request is not None:  # with auto only (pool_spec.py)
        args += ["--expected-chunks-per-request", str(spec.expected_chunks_per_request)]
    # $(POD_IP) is expanded by the kubelet from the container's env: the engine listens on the
    # pod's address only, and gateways dial it there
    args += ["--node-type", spec.node_type, "--pool", pool_name, "--zmq-port", str(ZMQ_PORT),
             "--metrics-port", str(METRICS_PORT), "--release", release, "--bind-address", "$(POD_IP)",
             "--advertise-host", "$(POD_IP)", "--device", "cuda" if spec.gpus_per_replica else "cpu",
             "--drain-timeout-s", str(spec.drain_timeout_s)]
    for file, digest in sorted(spec.model_sha256.items()):
        args += ["--model-sha256", f"{file}={digest}"]
    args += settings_args(spec.engine_settings)  # the compute settings the pool sets; the rest are the engine's defaults
    if spec.gpus_per_replica > 1:  # backend vllm only (pool_spec.py): one engine spans the pod's GPUs
        args += ["--tensor-parallel-size", str(spec.gpus_per_replica)]
    if spec.lora is not None:  # with Redis, the engine then loads the versions the rollout state names
        args += ["--max-loras", str(spec.lora.max_loras), "--max-cpu-loras", str(spec.lora.max_cpu_loras),
                 "--max-lora-rank", str(spec.lora.max_lora_rank), "--lora-kernel", spec.lora.kernel,
                 "--adapter-root", spec.lora.adapter_root]
    return args


def volumes_and_mounts(spec: EnginePoolSpec, release: str) -> tuple[list[dict], list[dict]]:
    """The pod's volumes and the engine's mounts: /tmp always, /dev/shm for an engine over several
    GPUs, the models PVC when the model is a path on it, and the adapters' claim (by default the
    models PVC) at the adapter root."""
    volumes = [{"name": "tmp", "emptyDir": {}}]
    mounts = [{"name": "tmp", "mountPath": SCRATCH_MOUNT}]
    if spec.gpus_per_replica > 1:
        volumes.append(SHARED_MEMORY)
        mounts.append({"name": SHARED_MEMORY["name"], "mountPath": "/dev/shm"})
    models_claim = models_claim_name(release)
    if spec.model.startswith(MODELS_MOUNT + "/"):
        volumes.append(_claim_volume("models", models_claim))
        mounts.append({"name": "models", "mountPath": MODELS_MOUNT, "readOnly": True})
    if spec.lora is not None:
        claim = spec.lora.claim_name or models_claim
        name = "models" if claim == models_claim else "adapters"
        if not any(v["name"] == name for v in volumes):
            volumes.append(_claim_volume(name, claim))
        mounts.append({"name": name, "mountPath": spec.lora.adapter_root, "readOnly": True})
    return volumes, mounts


def _claim_volume(name: str, claim: str) -> dict:
    return {"name": name, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}


def engine_env(config: OperatorConfig, operator_env: Mapping[str, str]) -> list[dict]:
    """The Redis URL comes from the release's Secret when the operator names one (the URL may
    carry a password), else as the operator's own URL, which then carries none. The CURVE key
    comes from the release's transport Secret when the operator names one, with a rotation's second
    key when the Secret holds one (optional references: a Secret without them starts the pod); else
    there is none."""
    if config.redis_secret is None:
        redis_url = {"name": "K25_REDIS_URL", "value": config.redis_url}
    else:
        redis_url = {"name": "K25_REDIS_URL",
                     "valueFrom": {"secretKeyRef": {"name": config.redis_secret, "key": REDIS_URL_KEY}}}
    env = [{"name": "K25_RELEASE", "value": config.release},
           {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}, redis_url]
    if config.curve_secret is not None:
        env.append({"name": CURVE_ENV,
                    "valueFrom": {"secretKeyRef": {"name": config.curve_secret, "key": CURVE_SECRET_KEY_KEY}}})
        env.extend({"name": name, "valueFrom": {"secretKeyRef": {"name": config.curve_secret, "key": key, "optional": True}}}
                   for name, key in ((CURVE_NEXT_ENV, CURVE_NEXT_KEY_KEY), (CURVE_PREVIOUS_ENV, CURVE_PREVIOUS_KEY_KEY)))
    return env + [{"name": name, "value": operator_env[name]} for name in TRACING_ENV if operator_env.get(name)]


def owner_reference(pool: dict) -> dict:
    """Makes the pool the Deployment's controller: deleting the pool deletes the Deployment."""
    return {"apiVersion": pool["apiVersion"], "kind": pool["kind"], "name": pool["metadata"]["name"],
            "uid": pool["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def owned_by(deployment: dict, pool_uid: str) -> bool:
    """Whether the pool may change or delete this Deployment: one of its owner references is
    the pool. A Deployment of the pool's name that another party made (or that an earlier
    pool of the same name left for the garbage collector) is not."""
    return any(ref.get("uid") == pool_uid for ref in deployment.get("metadata", {}).get("ownerReferences") or [])


def engine_pod_template(pool: dict, spec: EnginePoolSpec, config: OperatorConfig, args: list[str], env: list[dict],
                        serves: bool = True, ports: tuple[dict, ...] = ()) -> dict:
    """The pod template of an engine pod. `serves`: it is the engine gateways dial (its ZMQ and
    metrics ports, and the probes on them); else a node of a node group's other than the first,
    which has neither. `ports`: more ports the container declares."""
    name, release = pool["metadata"]["name"], config.release
    volumes, mounts = volumes_and_mounts(spec, release)
    if config.redis_ca_secret is not None:  # Redis speaks TLS: its CA, which the engine's URL names
        volumes.append({"name": "redis-tls", "secret": {"secretName": config.redis_ca_secret,
                                                        "items": [{"key": "ca.crt", "path": "ca.crt"}]}})
        mounts.append({"name": "redis-tls", "mountPath": REDIS_CA_DIR, "readOnly": True})
    served = [{"name": "zmq", "containerPort": ZMQ_PORT}, {"name": "metrics", "containerPort": METRICS_PORT}]
    probes = {"startupProbe": STARTUP_PROBE, "livenessProbe": LIVENESS_PROBE, "readinessProbe": READINESS_PROBE}
    container = {
        "name": "engine",
        "image": spec.image,
        "args": args,
        "env": env,
        "ports": (served if serves else []) + list(ports),
        "resources": container_resources(spec.resources, spec.gpus_per_replica),
        **(probes if serves else {}),
        "securityContext": CONTAINER_SECURITY_CONTEXT,
        "volumeMounts": mounts,
    }
    return {
        "metadata": {"labels": pod_labels(name, release), "annotations": dict(spec.pod_annotations)},
        "spec": {
            "nodeSelector": dict(spec.node_selector),
            "tolerations": [dict(t) for t in spec.tolerations],
            "automountServiceAccountToken": False,  # engines never call the Kubernetes API
            "terminationGracePeriodSeconds": termination_grace_s(spec),
            "topologySpreadConstraints": spread_over_nodes({POOL_LABEL: name}),
            **({"priorityClassName": spec.priority_class_name} if spec.priority_class_name else {}),
            "securityContext": POD_SECURITY_CONTEXT,
            "containers": [container],
            "volumes": volumes,
        },
    }


def workload_metadata(pool: dict, config: OperatorConfig, templates: dict) -> dict:
    """A workload's metadata: the pods' labels, the hash of the pod templates it runs, the pool as owner."""
    return {
        "name": workload_name(pool["metadata"]["name"]),
        "namespace": pool["metadata"]["namespace"],
        "labels": pod_labels(pool["metadata"]["name"], config.release),
        "annotations": {TEMPLATE_HASH: template_hash(templates)},
        "ownerReferences": [owner_reference(pool)],
    }


def build_deployment(pool: dict, spec: EnginePoolSpec, replicas: int, config: OperatorConfig,
                     operator_env: Mapping[str, str] = os.environ) -> dict:
    """`operator_env`: the operator's own environment, whose tracing variables the engines get."""
    name = pool["metadata"]["name"]
    template = engine_pod_template(pool, spec, config, engine_args(spec, name, config.release),
                                   engine_env(config, operator_env))
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": workload_metadata(pool, config, template),
        "spec": {"replicas": replicas, "selector": {"matchLabels": {POOL_LABEL: name}}, "template": template},
    }
