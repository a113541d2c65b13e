"""A node of a vLLM-backed engine other than the first (`k25 engine --backend vllm --node-rank R`,
R > 0): vLLM's headless workers for this node's GPUs, as vLLM's own `vllm serve --headless` runs
them, with the engine arguments the first node's engine builds. It serves no wire and joins no
registry: the engine on node 0 schedules, this node computes its pipeline stage.

It stops when one of its workers does (it failed, or the first node went away). SIGTERM does not
stop it at once: the engine on node 0, stopped with it, drains its running requests first, which
need every stage; so after SIGTERM it waits until node 0's address no longer answers on the
master port (torch.distributed's store, held by node 0's workers until its engine exits)."""

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable

from engine.vllm_core.engine_plan import EnginePlan

log = logging.getLogger(__name__)
LEADER_POLL_S = 1.0


def serve_headless(plan: EnginePlan) -> int:
    """The exit status: 0 after SIGTERM once node 0 has gone, 1 when a worker stopped before
    (Kubernetes then restarts the node group)."""
    os.environ.update(plan.env)
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    vllm_config = plan.vllm_engine_args().create_engine_config(headless=True)
    parallel = vllm_config.parallel_config
    first = parallel.node_rank * parallel.local_world_size
    log.info("vLLM headless workers: node %d of %d, ranks %d-%d of %d, node 0 at %s:%d", parallel.node_rank,
             parallel.nnodes, first, first + parallel.local_world_size - 1, parallel.world_size,
             parallel.master_addr, parallel.master_port)
    executor = MultiprocExecutor(vllm_config, monitor_workers=False)
    stopping = threading.Event()

    def on_sigterm(_signum, _frame):
        if not stopping.is_set():
            stopping.set()
            log.info("SIGTERM: serving node 0 until it has gone")
            threading.Thread(target=outlive_leader, args=(parallel.master_addr, parallel.master_port, executor.shutdown),
                             name="outlive-leader", daemon=True).start()

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        executor.start_worker_monitor(inline=True)  # returns when a worker stops, or the executor shuts down
    finally:
        executor.shutdown()
    if stopping.is_set():
        return 0
    log.error("vLLM headless workers: a worker stopped")
    return 1


def outlive_leader(host: str, port: int, then: Callable[[], None], poll_s: float = LEADER_POLL_S) -> None:
    """Calls `then` once nothing accepts a connection at host:port any more."""
    while answers(host, port, timeout_s=poll_s):
        time.sleep(poll_s)
    then()


def answers(host: str, port: int, timeout_s: float) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False
