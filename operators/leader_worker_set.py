"""The engines of a pool over several nodes (nodesPerReplica above 1, backend vllm only) as a
LeaderWorkerSet (leaderworkerset.x-k8s.io/v1, the Kubernetes SIG's API for multi-node
inference): each replica is a group of nodesPerReplica pods, one a node, each with the pool's
gpusPerReplica GPUs, that together run one engine. vLLM splits the model's layers among the nodes
(pipeline parallel, a stage a node) and each stage over the node's GPUs (tensor parallel), over
its multiprocessing executor, without Ray.

- The leader (node 0) runs `k25 engine` as a Deployment's pod does, and is the only pod of the
  group that talks to gateways (ZMQ) and Redis (heartbeat, KV events): its probes, ports and
  Secrets are a single-node engine's.
- The workers run the same `k25 engine` arguments with their node rank, which makes it run only
  vLLM's headless workers (engine/vllm_core/headless.py): no probes, no ZMQ or metrics port, no
  Redis URL or transport key.
- Every pod finds the leader at LWS_LEADER_ADDRESS and its own rank in LWS_WORKER_INDEX, which
  LeaderWorkerSet's controller puts in each container's environment (the kubelet expands
  $(NAME) in the arguments from it).
- A failed pod restarts its whole group (restartPolicy RecreateGroupOnPodRestart): vLLM's ranks
  cannot rejoin a running group.
- The group's pods carry k25.io/node-group, by which the chart's NetworkPolicy lets them reach
  each other on any port (torch.distributed, vLLM's message queues and NCCL choose theirs).
"""

import os
from collections.abc import Mapping

from common.engine_settings import VLLM_MASTER_PORT as MASTER_PORT
from operators.config import OperatorConfig
from operators.deployment import engine_args, engine_env, engine_pod_template, workload_metadata, workload_name
from operators.pool_spec import EnginePoolSpec

API_VERSION = "leaderworkerset.x-k8s.io/v1"
LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"
WORKER_INDEX = "$(LWS_WORKER_INDEX)"
# vLLM's processes on each node tell the others this address (their own pod's)
HOST_IP_ENV = {"name": "VLLM_HOST_IP", "value": "$(POD_IP)"}
POD_IP_ENV = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
NODE_GROUP_PORT = {"name": "node-group", "containerPort": MASTER_PORT}
NODE_GROUP_LABEL = "k25.io/node-group"


def node_group_args(nodes: int, rank: str) -> list[str]:
    """The `k25 engine` flags that place one pod in its group."""
    return ["--nnodes", str(nodes), "--node-rank", rank, "--master-addr", LEADER_ADDRESS,
            "--master-port", str(MASTER_PORT)]


def build_leader_worker_set(pool: dict, spec: EnginePoolSpec, replicas: int, config: OperatorConfig,
                            operator_env: Mapping[str, str] = os.environ) -> dict:
    """`replicas`: engines, each a group of spec.nodes_per_replica pods."""
    nodes, args = spec.nodes_per_replica, engine_args(spec, pool["metadata"]["name"], config.release)
    leader = engine_pod_template(pool, spec, config, args + node_group_args(nodes, "0"),
                                 engine_env(config, operator_env) + [HOST_IP_ENV], ports=(NODE_GROUP_PORT,))
    worker = engine_pod_template(pool, spec, config, args + node_group_args(nodes, WORKER_INDEX),
                                 [POD_IP_ENV, HOST_IP_ENV], serves=False)
    for template in (leader, worker):  # the chart's NetworkPolicy lets a group's pods reach each other by it
        template["metadata"]["labels"][NODE_GROUP_LABEL] = workload_name(pool["metadata"]["name"])
    group = {"size": nodes, "restartPolicy": "RecreateGroupOnPodRestart", "leaderTemplate": leader,
             "workerTemplate": worker}
    return {
        "apiVersion": API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": workload_metadata(pool, config, group),
        # LeaderCreated: the workers start beside the leader, which waits for them to join
        "spec": {"replicas": replicas, "startupPolicy": "LeaderCreated", "leaderWorkerTemplate": group},
    }
