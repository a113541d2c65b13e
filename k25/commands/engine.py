"""`k25 engine`: serve one engine over ZMQ, register it in Redis, expose /metrics."""

import argparse
import logging
import os
import socket
import sys
import threading
import uuid

from common.engine_settings import VLLM_MASTER_PORT as MASTER_PORT
from common.zmq_router import DEFAULT_MAX_FRAME_BYTES
from engine.serve.health import HealthSettings
from k25.commands.engine_backend import serve_vllm_workers, start_backend
from k25.commands.engine_settings import add_engine_settings, max_chunk_per_gpu_flag
from k25.commands.redis_flags import add_redis_flags

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_DRAIN_TIMEOUT_S = 25.0  # inside Kubernetes' default 30 s grace period; the chart sizes its grace period from it
DEFAULT_HEALTH = HealthSettings()

log = logging.getLogger("k25.engine")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "engine",
        help="serve the engine to gateways over ZMQ (one GPU, or this CPU)",
        description="Load a model, serve it on a ZMQ ROUTER socket, heartbeat into Redis and expose Prometheus metrics "
        "(/metrics) and health (/healthz) on the metrics port. SIGTERM or SIGINT drains it: it leaves the registry at once, "
        "refuses new requests with CANCELLED (gateways retry those elsewhere), lets running ones finish for up to "
        "--drain-timeout-s, ends the rest with CANCELLED and exits 0; a second signal stops the wait.",
    )
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"smollm2-135m, tiny-random, a .gguf file or a Hugging Face folder (default {DEFAULT_MODEL})")
    p.add_argument("--model-sha256", action="append", default=[], metavar="FILE=HEX",
                   help="refuse to start unless FILE (relative to the model's folder: the Hugging Face folder or the "
                   "one holding the .gguf) has this sha256; repeatable")
    p.add_argument("--chunk-size", type=int, default=256, help="the chunk_size requests must be padded for (default 256)")
    p.add_argument("--max-chunk-per-gpu", type=max_chunk_per_gpu_flag, default=None, metavar="N|auto",
                   help="KV capacity in chunks: a number (e.g. `k25 bench profile`'s recommendation), or auto: enough "
                   "for --max-num-seqs requests of --expected-chunks-per-request chunks at once, or as many as fit "
                   "(default: the node type's)")
    p.add_argument("--expected-chunks-per-request", type=int, default=1, metavar="N",
                   help="for --max-chunk-per-gpu auto: the KV chunks a typical request holds, prompt and output "
                   "(default 1)")
    p.add_argument("--node-type", default="cpu", help="a100-40g, a100-80g, h100-80g, h200 or cpu (default cpu)")
    p.add_argument("--max-waiting", type=int, default=1024, help="queued requests beyond which new ones are refused (default 1024)")
    lora = p.add_argument_group("LoRA adapters")
    lora.add_argument("--max-loras", type=int, default=0, help="adapters on the device at once; 0 turns adapters off (default 0)")
    lora.add_argument("--max-cpu-loras", type=int, default=8, help="adapters kept in CPU memory (default 8)")
    lora.add_argument("--max-lora-rank", type=int, default=64, help="highest adapter rank accepted (default 64)")
    lora.add_argument("--adapter-root", default=None, help="adapters load only from folders under this one")
    lora.add_argument("--lora-kernel", default="torch", choices=["torch", "triton"], help="the LoRA delta's kernel (default torch)")
    lora.add_argument("--inject-fault", action="append", default=[], metavar="NAME@VERSION",
                      help="fail every request for this adapter version with INTERNAL (for testing canary rollbacks)")
    p.add_argument("--inject-step-failures-while", metavar="PATH",
                   help="every step fails, as a failing forward pass would, while the file PATH exists; {engine_id} in "
                   "PATH stands for this engine's id (for chaos tests of one engine among several)")
    p.add_argument("--tensor-parallel-size", type=int, default=1, metavar="GPUS",
                   help="GPUs one engine spans (an EnginePool's gpusPerReplica); more than 1 needs --backend vllm "
                   "(default 1)")
    nodes = p.add_argument_group("one engine over several nodes (--backend vllm; a LeaderWorkerSet group in a pool)")
    nodes.add_argument("--nnodes", type=int, default=1, metavar="NODES",
                       help="nodes one engine spans, one process a node (vLLM's multiprocessing executor, no Ray): its "
                       "--pipeline-parallel-size x --tensor-parallel-size ranks are split evenly among them (default 1)")
    nodes.add_argument("--node-rank", type=int, default=0, metavar="RANK",
                       help="this node's place among them: 0 serves the engine (ZMQ, heartbeat, metrics); any other "
                       "runs only vLLM's headless workers for this node's share of the ranks (default 0)")
    nodes.add_argument("--master-addr", default="127.0.0.1", metavar="HOST",
                       help="node 0's address, where the nodes meet (torch.distributed's store) (default 127.0.0.1)")
    nodes.add_argument("--master-port", type=int, default=MASTER_PORT, metavar="PORT",
                       help=f"node 0's port for them (default {MASTER_PORT})")
    p.add_argument("--enforce-eager", action="store_true",
                   help="with --backend vllm: run the model eagerly, without torch.compile or CUDA graphs (starts in "
                   "seconds instead of minutes, serves slower)")
    p.add_argument("--pool", default="default", help="the pool this engine serves (default 'default')")
    p.add_argument("--zmq-port", type=int, default=5555, help="ROUTER port (default 5555)")
    p.add_argument("--bind-address", default="0.0.0.0",
                   help="interface the ZMQ ROUTER and the metrics port listen on, e.g. the pod IP or 127.0.0.1 "
                   "(default 0.0.0.0: every interface)")
    p.add_argument("--metrics-port", type=int, default=9100,
                   help="port of Prometheus /metrics and of /healthz; 0 turns both off (default 9100)")
    add_redis_flags(p, "registry Redis; '' runs without one")
    p.add_argument("--advertise-host", default="127.0.0.1", help="host gateways dial, e.g. the pod IP (default 127.0.0.1)")
    p.add_argument("--engine-id", default=None, help="registry name (default HOSTNAME-ZMQPORT)")
    p.add_argument("--sndhwm", type=int, default=5000,
                   help="ZMQ send high-water mark per peer, in frames (one per engine step; default 5000)")
    p.add_argument("--rcvhwm", type=int, default=5000, help="ZMQ receive high-water mark per peer (default 5000)")
    p.add_argument("--linger-ms", type=int, default=1000, help="how long unsent messages may delay shutdown (default 1000)")
    p.add_argument("--max-frame-bytes", type=int, default=DEFAULT_MAX_FRAME_BYTES,
                   help="longest frame a client may send; ZMQ drops a longer one and disconnects its sender "
                   f"(default {DEFAULT_MAX_FRAME_BYTES}, 16 MiB)")
    p.add_argument("--heartbeat-interval-s", type=float, default=1.0, help="registry refresh period (default 1)")
    p.add_argument("--heartbeat-ttl-s", type=float, default=5.0, help="registry entry lifetime without a refresh (default 5)")
    life = p.add_argument_group("shutdown and health")
    life.add_argument("--drain-timeout-s", type=float, default=DEFAULT_DRAIN_TIMEOUT_S,
                      help="after SIGTERM, how long running requests may take to finish before they are ended with "
                      f"CANCELLED (default {DEFAULT_DRAIN_TIMEOUT_S:g}); give the pod a longer grace period")
    life.add_argument("--step-stall-s", type=float, default=DEFAULT_HEALTH.step_stall_s,
                      help="with requests to run and no engine step finished for this long, the engine reports "
                      f"unhealthy (default {DEFAULT_HEALTH.step_stall_s:g})")
    life.add_argument("--max-failed-steps", type=int, default=DEFAULT_HEALTH.max_failed_steps,
                      help="engine steps failing in a row after which it reports unhealthy until one succeeds "
                      f"(default {DEFAULT_HEALTH.max_failed_steps})")
    add_engine_settings(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from engine.hardware.cpu_threads import omp_wait_env

    os.environ.update(omp_wait_env(os.environ))  # before torch loads libgomp
    log.info("OpenMP waits: GOMP_SPINCOUNT=%s OMP_WAIT_POLICY=%s",
             os.environ.get("GOMP_SPINCOUNT", "unset"), os.environ.get("OMP_WAIT_POLICY", "unset"))
    import zmq

    from common.model_source import ModelLoadError
    from common.tracing import setup_tracing
    from common.zmq_curve import CurveKeyError, keys_from_env
    from engine.base.errors import EngineConfigError
    from engine.model.integrity import parse_model_checksums, verify_model_files
    from engine.serve.heartbeat import Heartbeat, registry_client
    from engine.serve.kv_events import KVEventPublisher
    from engine.serve.metrics import EngineMetrics
    from engine.serve.registry import EngineProfile, registry_entry
    from engine.serve.rollout_watcher import RolloutWatcher
    from engine.serve.server import EngineServer, ServerSettings
    from engine.serve.shutdown import ShutdownSignals
    from engine.serve.tracing import RequestTraces

    problem = invalid_flags(args)
    if problem:
        print(f"k25 engine: {problem}", file=sys.stderr)
        return 2
    try:
        curve_secret_key = keys_from_env()
    except CurveKeyError as exc:
        print(f"k25 engine: {exc}", file=sys.stderr)
        return 2
    try:
        checksums = parse_model_checksums(args.model_sha256)
        if checksums:
            log.info("checking the sha256 of %d model files", len(checksums))
            verify_model_files(args.model, checksums)
        if args.node_rank > 0:  # another node of node 0's engine: vLLM's workers, no wire, no registry
            return serve_vllm_workers(args)
        engine = start_backend(args)
        config = engine.config
    except (ModelLoadError, EngineConfigError) as exc:
        print(f"k25 engine: {exc}", file=sys.stderr)
        return 2
    settings = ServerSettings(
        port=args.zmq_port, bind_host=args.bind_address, sndhwm=args.sndhwm, rcvhwm=args.rcvhwm, linger_ms=args.linger_ms,
        max_frame_bytes=args.max_frame_bytes, curve_secret_key=curve_secret_key, faulty_adapters=frozenset(args.inject_fault),
        health=HealthSettings(max_failed_steps=args.max_failed_steps, step_stall_s=args.step_stall_s),
    )
    metrics = EngineMetrics()
    try:
        server = EngineServer(engine, settings, metrics)
    except zmq.ZMQError as exc:
        print(f"k25 engine: cannot listen on ZMQ port {args.zmq_port} at {args.bind_address}: {exc}", file=sys.stderr)
        return 2
    try:
        metrics_port = (metrics.serve(args.metrics_port, args.bind_address, lambda: server.health_report().fields())
                        if args.metrics_port else None)
    except OSError as exc:
        server.close()
        print(f"k25 engine: cannot serve metrics on port {args.metrics_port} at {args.bind_address}: {exc}", file=sys.stderr)
        return 2

    engine_id = args.engine_id or f"{socket.gethostname()}-{server.port}"
    if args.inject_step_failures_while:
        engine.runner.before_forward = _fail_steps_while(args.inject_step_failures_while.replace("{engine_id}", engine_id))
    profile = EngineProfile(
        engine_id=engine_id,
        address=f"{args.advertise_host}:{server.port}",
        pool=args.pool,
        node_type=args.node_type,
        model=args.model,
        chunk_size=config.chunk_size,
        max_chunk_per_gpu=engine.max_chunk_per_gpu,
        capacity_tokens=engine.capacity_tokens,
        max_model_len=engine.max_model_len,
        kv_admission_limit=config.kv_admission_limit,
        max_waiting=config.max_waiting,
        heartbeat_ttl_s=args.heartbeat_ttl_s,
        block_size=config.block_size,
        prefix_caching=config.prefix_caching,
        dtype=config.dtype,
        incarnation=uuid.uuid4().hex,
    )
    server.traces = RequestTraces(engine_id, args.pool, args.model)
    tracing = setup_tracing("k25-engine")
    heartbeat = watcher = kv_events = None
    if args.redis_url and args.max_loras:
        watcher = RolloutWatcher(registry_client(args.redis_url), args.release, server)
    if args.redis_url:
        heartbeat = Heartbeat(
            registry_client(args.redis_url), args.release, engine_id,
            lambda: registry_entry(profile, server.stats, server.health_report()),
            interval_s=args.heartbeat_interval_s, ttl_s=args.heartbeat_ttl_s,
        )
        if config.prefix_caching:
            kv_events = KVEventPublisher(registry_client(args.redis_url), args.release, engine_id, profile.incarnation)
            server.publish_cache_events(kv_events)

    signals = ShutdownSignals()
    signals.install()
    log.info(
        "engine %s: pool %s, zmq tcp://%s (bound on %s), metrics and health %s, registry %s",
        engine_id, args.pool, profile.address, args.bind_address,
        f":{metrics_port} (/metrics, /healthz)" if metrics_port else "off", args.redis_url or "off",
    )
    for part in (heartbeat, watcher, kv_events):
        if part is not None:
            part.start()

    def leave() -> None:
        """Out of the registry and the gateways' prefix indexes at once, off the serving thread
        (a slow Redis must not hold up the running requests)."""
        for part in (heartbeat, kv_events, watcher):  # heartbeat first: gateways stop routing here
            if part is not None:
                part.stop()

    leaving = threading.Thread(target=leave, name="leave-registry")
    try:
        server.serve(signals)
        log.info("engine %s: stop signal; draining for up to %g s (a second signal stops the wait)",
                 engine_id, args.drain_timeout_s)
        server.begin_drain()  # refusing before leaving: a gateway that no longer sees this engine gets no new work here
        leaving.start()
        server.drain(args.drain_timeout_s, signals.hurry)
    finally:
        if not server.socket.closed:  # serving failed: no drain
            server.close()
        if leaving.ident is None:
            leaving.start()
        leaving.join()
        metrics.close()
        if tracing is not None:
            tracing.shutdown()
    log.info("engine %s stopped", engine_id)
    return 0


def invalid_flags(args: argparse.Namespace) -> str:
    """What is wrong with the flags that argparse cannot check, or ""."""
    if args.heartbeat_ttl_s <= args.heartbeat_interval_s:
        return "--heartbeat-ttl-s must be longer than --heartbeat-interval-s"
    if not args.drain_timeout_s >= 0:
        return f"--drain-timeout-s must be 0 or more, got {args.drain_timeout_s}"
    if not args.step_stall_s > 0:
        return f"--step-stall-s must be positive, got {args.step_stall_s}"
    if args.max_failed_steps < 1:
        return f"--max-failed-steps must be at least 1, got {args.max_failed_steps}"
    if args.max_frame_bytes < 1:
        return f"--max-frame-bytes must be at least 1, got {args.max_frame_bytes}"
    if args.tensor_parallel_size < 1:
        return f"--tensor-parallel-size must be at least 1, got {args.tensor_parallel_size}"
    if args.backend == "k25" and args.tensor_parallel_size > 1:
        return (f"--tensor-parallel-size {args.tensor_parallel_size}: K25's engine runs on one GPU; "
                "--backend vllm serves a model over several")
    if args.backend == "k25" and args.expert_parallel:
        return "--expert-parallel: K25's engine serves no mixture of experts; --backend vllm does"
    if args.backend == "k25" and (args.pipeline_parallel_size > 1 or args.nnodes > 1):
        flag = f"--pipeline-parallel-size {args.pipeline_parallel_size}" if args.pipeline_parallel_size > 1 \
            else f"--nnodes {args.nnodes}"
        return f"{flag}: K25's engine runs on one GPU; --backend vllm serves a model over several nodes"
    ranks = args.tensor_parallel_size * args.pipeline_parallel_size
    if args.nnodes < 1 or ranks % args.nnodes:
        return (f"--nnodes {args.nnodes} must divide the engine's {ranks} ranks (--pipeline-parallel-size x "
                "--tensor-parallel-size) evenly")
    if not 0 <= args.node_rank < args.nnodes:
        return f"--node-rank must be from 0 to {args.nnodes - 1} (--nnodes {args.nnodes}), got {args.node_rank}"
    if args.backend == "vllm" and args.inject_step_failures_while:
        return "--inject-step-failures-while fails K25's engine's forward pass; not with --backend vllm"
    if args.expected_chunks_per_request < 1:
        return f"--expected-chunks-per-request must be at least 1, got {args.expected_chunks_per_request}"
    return ""


def _fail_steps_while(path: str):
    """The engine's before-forward hook for --inject-step-failures-while."""

    def check(_batch) -> None:
        if os.path.exists(path):
            raise RuntimeError(f"injected step failure ({path} exists)")

    return check
