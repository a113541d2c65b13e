"""`k25 engine` as a real process: real DEALER sockets, a private Redis, its /metrics and
/healthz, its bind address, frame limit and model checksums.

One engine (tiny-random) serves every test of this module."""

import hashlib
import os
import subprocess
import urllib.request

import psutil
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families
from zmq.utils.monitor import recv_monitor_message

from common.redis_keys import engines_expiry_key
from engine.base.config import EngineConfig
from engine.core.sampling_params import SamplingParams
from engine.llm_engine import LLMEngine
from engine.offline import generate
from k25.cli import build_parser
from proto import k25_pb2
from tests.helpers.engine_frames import malformed_frames
from tests.helpers.engine_process import (
    K25,
    RELEASE,
    dealer,
    generate_message,
    receive,
    receive_until_done,
    request_id_of,
    send,
    start_engine,
    wait_until,
)
from tests.helpers.http_json import get_json
from tests.helpers.redis_server import module_redis_url  # noqa: F401 (fixture)

CHUNK = 32
MAX_CHUNKS = 64  # KV for 2,048 tokens: room for a long request to cancel
MAX_WAITING = 500  # not the default: the heartbeat must report the engine's own
MAX_FRAME_BYTES = 1 << 20


@pytest.fixture(scope="module")
def gguf_sha256(smollm2_gguf) -> str:
    """`--model-sha256` of the file tiny-random's tokenizer comes from (its model folder's)."""
    with open(smollm2_gguf, "rb") as f:
        return f"{os.path.basename(smollm2_gguf)}={hashlib.file_digest(f, 'sha256').hexdigest()}"


@pytest.fixture(scope="module")
def engine(module_redis_url, tmp_path_factory, gguf_sha256):
    handle = start_engine(
        module_redis_url, str(tmp_path_factory.mktemp("engine") / "engine.log"),
        "--model", "tiny-random", "--chunk-size", str(CHUNK), "--max-chunk-per-gpu", str(MAX_CHUNKS), "--pool", "short",
        "--max-waiting", str(MAX_WAITING), "--bind-address", "127.0.0.1", "--max-frame-bytes", str(MAX_FRAME_BYTES),
        "--model-sha256", gguf_sha256,
    )
    yield handle
    handle.stop()


@pytest.fixture
def client(engine):
    socket = dealer(engine.address)
    yield socket
    socket.close()


@pytest.fixture(scope="module")
def prompt(tiny_model) -> list[int]:
    return tiny_model.tokenizer.encode("The contract says that the tenant")


def scrape(engine) -> dict[str, float]:
    """Every sample on /metrics: 'name{label="v",...}' (or bare name) -> value."""
    text = urllib.request.urlopen(engine.metrics_url, timeout=10).read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def kinds(messages) -> list[str]:
    return [m.WhichOneof("kind") for m in messages]


def test_greedy_request_streams_deltas_then_a_final_equal_to_the_in_process_engine(engine, client, tiny_model, prompt):
    local = LLMEngine(tiny_model, EngineConfig(chunk_size=CHUNK, max_chunk_per_gpu=MAX_CHUNKS))
    (expected,) = generate(local, [prompt], SamplingParams(max_tokens=24))

    message = generate_message(prompt, CHUNK, tiny_model.tokenizer.pad_token_id, max_tokens=24)
    send(client, message)
    messages = receive_until_done(client, message.generate.request_id)

    assert kinds(messages)[-1] == "final" and set(kinds(messages)[:-1]) == {"delta"}
    tokens = [t for m in messages[:-1] for t in m.delta.token_ids]
    assert tokens == expected.token_ids
    assert "".join(m.delta.text for m in messages[:-1]) == expected.text
    final = messages[-1].final
    assert final.finish_reason == k25_pb2.FinishReason.Value(expected.finish_reason.name)
    assert (final.usage.prompt_tokens, final.usage.completion_tokens) == (len(prompt), len(expected.token_ids))
    assert final.usage.pad_tokens == message.generate.pad_length


@pytest.mark.parametrize("padded_for", [CHUNK + 16, CHUNK * 2])
def test_a_request_padded_for_another_chunk_size_is_refused(client, tiny_model, prompt, padded_for):
    message = generate_message(prompt, padded_for, tiny_model.tokenizer.pad_token_id, max_tokens=4)
    send(client, message)
    (reply,) = receive_until_done(client, message.generate.request_id)
    assert reply.error.code == k25_pb2.CHUNK_SIZE_MISMATCH
    assert str(CHUNK) in reply.error.message


def test_a_padded_length_that_is_not_a_multiple_of_the_chunk_size_is_refused(client, prompt):
    message = generate_message(prompt, CHUNK, max_tokens=4)
    message.generate.prompt_token_ids.append(0)  # one pad too many
    message.generate.pad_length += 1
    send(client, message)
    (reply,) = receive_until_done(client, message.generate.request_id)
    assert reply.error.code == k25_pb2.CHUNK_SIZE_MISMATCH


def test_an_adapter_that_is_not_loaded_is_refused(client, prompt):
    message = generate_message(prompt, CHUNK, max_tokens=4)
    message.generate.adapter.name = "contracts"
    send(client, message)
    (reply,) = receive_until_done(client, message.generate.request_id)
    assert reply.error.code == k25_pb2.ADAPTER_NOT_FOUND


def test_cancel_mid_stream_ends_the_request_and_frees_its_kv(engine, client, prompt):
    message = generate_message(prompt, CHUNK, max_tokens=1500, ignore_eos=True)
    request_id = message.generate.request_id
    send(client, message)
    first = receive(client)
    assert first.WhichOneof("kind") == "delta" and first.delta.request_id == request_id
    # cancelled at once: waiting for a heartbeat to show the KV in use could outlast the request
    # itself (1,500 tokens of the tiny model take ~2 s once its layer steps are fused)
    wait_until(lambda: scrape(engine)["k25_engine_kv_usage_ratio"] > 0, what="KV in use on /metrics")

    send(client, k25_pb2.ClientMessage(cancel=k25_pb2.CancelRequest(request_id=request_id)))
    messages = receive_until_done(client, request_id)

    final = messages[-1].final
    assert final.finish_reason == k25_pb2.ABORT
    assert final.usage.completion_tokens < 1500
    wait_until(lambda: scrape(engine)["k25_engine_kv_usage_ratio"] == 0, what="KV freed on /metrics")
    wait_until(lambda: engine.registry_entry()["free_kv_fraction"] == 1.0, what="KV freed in the heartbeat")
    assert scrape(engine)['k25_engine_requests_finished_total{finish_reason="abort"}'] >= 1


def test_a_peer_that_disconnects_mid_stream_has_its_requests_aborted(engine, prompt):
    gone = dealer(engine.address)
    message = generate_message(prompt, CHUNK, max_tokens=1500, ignore_eos=True)
    send(gone, message)
    assert receive(gone).delta.request_id == message.generate.request_id
    wait_until(lambda: scrape(engine)["k25_engine_kv_usage_ratio"] > 0, what="KV in use while the request runs")
    gone.close()  # no cancel: the engine finds out when its next send has nowhere to go

    def idle(samples):
        return samples["k25_engine_kv_usage_ratio"] == 0 and samples["k25_engine_running_requests"] == 0

    wait_until(lambda: idle(scrape(engine)), what="KV freed and nothing running after the peer left")


def test_a_cancel_for_an_unknown_request_is_ignored(client, prompt):
    send(client, k25_pb2.ClientMessage(cancel=k25_pb2.CancelRequest(request_id="never-sent")))
    message = generate_message(prompt, CHUNK, max_tokens=2)
    send(client, message)
    messages = receive_until_done(client, message.generate.request_id)
    assert kinds(messages)[-1] == "final"


def test_a_thousand_malformed_frames_are_answered_and_the_engine_keeps_serving(engine, client, prompt):
    for frames in malformed_frames(prompt, 1000):
        client.send_multipart(frames)
    good = generate_message(prompt, CHUNK, max_tokens=3)
    send(client, good)

    # the engine answers frames in order: 1,000 errors, then the good request's stream
    errors = [receive(client) for _ in range(1000)]
    assert {e.WhichOneof("kind") for e in errors} == {"error"}
    assert {e.error.code for e in errors} == {k25_pb2.INVALID_ARGUMENT}
    messages = receive_until_done(client, good.generate.request_id)
    assert messages[-1].final.finish_reason == k25_pb2.LENGTH
    assert engine.process.poll() is None


def test_the_heartbeat_registers_the_engine_with_its_facts_and_a_ttl(engine):
    entry = engine.registry_entry()
    assert entry["address"] == f"127.0.0.1:{engine.zmq_port}"
    assert (entry["pool"], entry["node_type"], entry["model"]) == ("short", "cpu", "tiny-random")
    assert (entry["chunk_size"], entry["max_chunk_per_gpu"], entry["capacity_tokens"]) == (CHUNK, MAX_CHUNKS, CHUNK * MAX_CHUNKS)
    assert 0.0 <= entry["free_kv_fraction"] <= 1.0
    assert isinstance(entry["running"], int) and isinstance(entry["waiting"], int)
    assert entry["adapters"] == []
    assert (entry["kv_admission_limit"], entry["max_waiting"]) == (EngineConfig().kv_admission_limit, MAX_WAITING)
    assert entry["heartbeat_ttl_s"] == 5.0
    seconds, microseconds = engine.redis.time()
    expires_in_ms = engine.redis.zscore(engines_expiry_key(RELEASE), engine.engine_id) - (seconds * 1000 + microseconds // 1000)
    assert 0 < expires_in_ms <= 5000


def test_the_heartbeat_carries_the_recent_ttft_p95(engine, client, prompt):
    """A percentile of the last minute's first tokens: at most the longest TTFT the engine's own
    histogram has counted (the upper bound of the first bucket that holds every sample)."""
    message = generate_message(prompt, CHUNK, max_tokens=4)
    send(client, message)
    receive_until_done(client, message.generate.request_id)
    ttft = wait_until(lambda: engine.registry_entry()["ttft_p95_s"], 15, what="a TTFT p95 in the heartbeat")
    samples = scrape(engine)
    counted = samples["k25_engine_time_to_first_token_seconds_count"]
    buckets = {float(key.split('le="')[1].rstrip('"}')): value for key, value in samples.items()
               if key.startswith("k25_engine_time_to_first_token_seconds_bucket")}
    assert 0 < ttft <= min(bound for bound, count in buckets.items() if count == counted)


def test_metrics_serve_the_engine_families(engine):
    names = {name.split("{")[0] for name in scrape(engine)}
    for expected in [
        "k25_engine_running_requests",
        "k25_engine_waiting_requests",
        "k25_engine_kv_usage_ratio",
        "k25_engine_time_to_first_token_seconds_bucket",
        "k25_engine_inter_token_latency_seconds_bucket",
        "k25_engine_request_duration_seconds_count",
        "k25_engine_preemptions_total",
    ]:
        assert expected in names


def test_a_second_engine_on_a_taken_port_exits_with_a_message(engine, module_redis_url):
    result = subprocess.run(
        [*K25, "engine", "--model", "tiny-random", "--chunk-size", str(CHUNK), "--max-chunk-per-gpu", str(MAX_CHUNKS),
         "--zmq-port", str(engine.zmq_port), "--metrics-port", "0", "--redis-url", module_redis_url],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert f"cannot listen on ZMQ port {engine.zmq_port}" in result.stderr


def test_help_lists_the_flags():
    result = subprocess.run([*K25, "engine", "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for flag in ["--model", "--chunk-size", "--max-chunk-per-gpu", "--node-type", "--pool", "--zmq-port", "--metrics-port",
                 "--redis-url", "--release", "--advertise-host", "--sndhwm", "--rcvhwm", "--linger-ms", "--bind-address",
                 "--max-frame-bytes", "--model-sha256", "--drain-timeout-s", "--step-stall-s", "--max-failed-steps"]:
        assert flag in result.stdout


def test_the_engine_listens_only_on_its_bind_address(engine):
    listening = {c.laddr.port: c.laddr.ip for c in psutil.Process(engine.process.pid).net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN}
    assert listening == {engine.zmq_port: "127.0.0.1", engine.metrics_port: "127.0.0.1"}


def test_healthz_answers_on_the_metrics_port(engine):
    status, body = get_json(f"http://127.0.0.1:{engine.metrics_port}/healthz")
    assert status == 200
    assert body == {"healthy": True, "unhealthy_reason": "", "draining": False,
                    "last_step_at": body["last_step_at"], "step_failures": 0}


def test_a_frame_over_the_limit_is_dropped_and_the_engine_serves_on(engine, prompt):
    sender = zmq.Context.instance().socket(zmq.DEALER)
    sender.setsockopt(zmq.LINGER, 0)
    link = sender.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)

    def next_link_event() -> int:
        assert link.poll(60_000), "no connection event within 60 s"
        return recv_monitor_message(link)["event"]

    sender.connect(engine.address)
    assert next_link_event() == zmq.EVENT_CONNECTED
    sender.send(b"\x0a" + b"\x00" * MAX_FRAME_BYTES)  # one byte over the limit
    assert next_link_event() == zmq.EVENT_DISCONNECTED  # ZMQ dropped the frame and the link, unread
    assert next_link_event() == zmq.EVENT_CONNECTED  # the sender reconnects on its own
    newcomer = dealer(engine.address)
    for client in (sender, newcomer):  # it is served again, and so is a newcomer
        message = generate_message(prompt, CHUNK, max_tokens=3)
        send(client, message)
        replies = [receive(client)]
        while replies[-1].WhichOneof("kind") == "delta":
            replies.append(receive(client))
        assert {request_id_of(r) for r in replies} == {message.generate.request_id}  # nothing answered the big frame
        assert replies[-1].final.usage.completion_tokens == 3
    sender.disable_monitor()
    for socket in (link, sender, newcomer):
        socket.close()
    assert engine.process.poll() is None and "Traceback" not in engine.log()


@pytest.mark.parametrize("checksum, fragment", [
    ("SmolLM2-135M-Instruct.Q4_1.gguf=" + "0" * 64, "SmolLM2-135M-Instruct.Q4_1.gguf has sha256 "),
    ("SmolLM2-135M-Instruct.Q4_1.gguf=sha256:" + "0" * 64, ", expected " + "0" * 64),
    ("no-such-file.safetensors=" + "0" * 64, "no-such-file.safetensors missing"),
    ("SmolLM2-135M-Instruct.Q4_1.gguf=abc", "64 hex digits"),
])
def test_a_model_file_that_does_not_hash_as_told_stops_the_engine_before_it_loads(module_redis_url, checksum, fragment):
    result = subprocess.run(
        [*K25, "engine", "--model", "tiny-random", "--model-sha256", checksum, "--zmq-port", "0", "--metrics-port", "0",
         "--redis-url", ""], capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()[-1:]
    assert line.startswith("k25 engine: ") and fragment in line and "Traceback" not in result.stderr


@pytest.mark.parametrize("flags, message", [
    (["--drain-timeout-s", "-1"], "--drain-timeout-s must be 0 or more"),
    (["--step-stall-s", "0"], "--step-stall-s must be positive"),
    (["--max-failed-steps", "0"], "--max-failed-steps must be at least 1"),
    (["--max-frame-bytes", "0"], "--max-frame-bytes must be at least 1"),
    (["--heartbeat-ttl-s", "1"], "--heartbeat-ttl-s must be longer"),
])
def test_flags_that_cannot_work_are_refused_before_anything_loads(flags, message, capsys):
    args = build_parser().parse_args(["engine", *flags])
    assert args.handler(args) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"k25 engine: {message}")


def test_the_defaults_the_chart_and_k25_up_rely_on():
    args = build_parser().parse_args(["engine"])
    assert (args.drain_timeout_s, args.step_stall_s, args.max_failed_steps) == (25.0, 60.0, 3)
    assert (args.max_frame_bytes, args.bind_address, args.model_sha256) == (16 * 1024 * 1024, "0.0.0.0", [])
