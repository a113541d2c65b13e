"""A pool over two nodes, from the operator's LeaderWorkerSet to vLLM's own configuration: each pod's
`k25 engine` arguments (as the kubelet expands them) go through `k25 engine`'s parser and the vLLM
backend's planning, and vLLM 0.32 builds its engine configuration from them as each node would:
the leader's as its engine, the worker's as its headless workers (`vllm serve --headless`'s own
path). vLLM is the reference for what the flags mean: two ranks a stage each, one a node, over
its multiprocessing executor, meeting at the leader's address; the model, KV blocks and limits the
same on both nodes. Nothing runs across nodes here (one machine, no GPU)."""

import json
import subprocess

import pytest

from operators.config import OperatorConfig
from operators.pool_spec import parse_pool_spec
from operators.workload import build_workload
from tests.helpers.leader_worker_set import container_args, lws_environment, pod_template
from tests.helpers.parity import save_random_llama
from tests.helpers.paths import REPO, VLLM_PYTHON

pytestmark = pytest.mark.slow

POOL = {"apiVersion": "k25.io/v1alpha1", "kind": "EnginePool", "metadata": {"name": "cpu2", "namespace": "serving",
                                                                               "uid": "u"}}
# each node: what vLLM decides for it from the flags `k25 engine` read
VLLM_SIDE = """
import json, sys
from k25.cli import build_parser
from k25.commands.engine_backend import _vllm_config
from engine.vllm_core.engine_plan import plan_engine

decided = {}
for args in json.loads(sys.argv[1]):
    parsed = build_parser().parse_args(args[1:])
    config, group = _vllm_config(parsed)
    plan = plan_engine(config, parsed.model, parsed.tensor_parallel_size, parsed.enforce_eager, group)
    vllm = plan.vllm_engine_args().create_engine_config(headless=parsed.node_rank > 0)
    p = vllm.parallel_config
    decided[parsed.node_rank] = dict(
        world=p.world_size, local=p.local_world_size, nnodes=p.nnodes, node_rank=p.node_rank_within_dp,
        stages=p.pipeline_parallel_size, tensor=p.tensor_parallel_size, backend=str(p.distributed_executor_backend),
        master=[p.master_addr, p.master_port], model=vllm.model_config.model, dtype=str(vllm.model_config.dtype),
        max_model_len=vllm.model_config.max_model_len, blocks=vllm.cache_config.num_gpu_blocks_override,
        block_size=vllm.cache_config.block_size, max_num_seqs=vllm.scheduler_config.max_num_seqs)
print("DECIDED " + json.dumps(decided))
"""


def test_both_nodes_of_a_group_configure_vllm_as_one_engine_split_in_two_stages(tmp_path, tiny_model):
    assert VLLM_PYTHON.exists(), f"{VLLM_PYTHON} is missing: `make vllm` builds it"
    folder = save_random_llama(tmp_path, tiny_model.tokenizer, hidden_size=256, num_attention_heads=4,
                               num_key_value_heads=2, intermediate_size=512, num_hidden_layers=4)
    spec = parse_pool_spec({"nodeType": "CPU", "model": str(folder), "chunkSize": 64, "maxChunkPerGpu": 4,
                            "backend": "vllm", "nodesPerReplica": 2, "dtype": "float32"})
    lws = build_workload(POOL, spec, 1, OperatorConfig(release="k25", redis_url="redis://redis:6379/0"), {})
    pods = [container_args(pod_template(lws, role), lws_environment(lws, group=0, worker=worker))
            for role, worker in (("leader", 0), ("worker", 1))]
    result = subprocess.run([str(VLLM_PYTHON), "-c", VLLM_SIDE, json.dumps([args + ["--enforce-eager"] for args in pods])],
                            capture_output=True, text=True, timeout=300, cwd=REPO, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    [line] = [x for x in result.stdout.splitlines() if x.startswith("DECIDED ")]
    leader, worker = (json.loads(line.removeprefix("DECIDED "))[rank] for rank in ("0", "1"))
    assert (leader["node_rank"], worker["node_rank"]) == (0, 1)
    assert {k: v for k, v in worker.items() if leader[k] != v} == {"node_rank": 1}
    assert (leader["world"], leader["local"], leader["nnodes"], leader["stages"], leader["tensor"]) == (2, 1, 2, 2, 1)
    assert leader["backend"] == "mp" and leader["master"] == ["cpu2-engine-0.cpu2-engine.serving", 29501]
    assert (leader["model"], leader["block_size"], leader["blocks"]) == (str(folder), 32, 4 * 64 // 32 + 1)
