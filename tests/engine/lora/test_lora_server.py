"""Adapters through the engine server: requests name one on the wire, the heartbeat lists the
loaded ones, and another thread loads one while a request streams. A real ROUTER/DEALER pair
and a private Redis; the served tokens are checked against transformers + peft."""

import threading

import pytest

from common.redis_keys import live_engines
from engine.base.config import EngineConfig
from engine.base.errors import EngineError, ErrorCode
from engine.llm_engine import LLMEngine
from engine.model.loader import load_model
from engine.serve.heartbeat import Heartbeat
from engine.serve.registry import EngineProfile, registry_entry
from engine.serve.server import EngineServer, ServerSettings
from proto import k25_pb2
from tests.helpers.engine_process import dealer, receive, receive_until_done, request_id_of, send
from tests.helpers.lora_helpers import adapter_request, peft_references, save_tiny_llama_with_adapters
from tests.helpers.parity import compare
from tests.helpers.redis_server import redis_client, redis_server  # noqa: F401  (fixtures)

CHUNK = 32
TOKENS = 8
SPECS = {
    "alpha": dict(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "down_proj"]),
    "beta": dict(r=16, lora_alpha=16, use_rslora=True, target_modules=["o_proj", "gate_proj", "up_proj"]),
}


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model):
    base = tmp_path_factory.mktemp("lora-server")
    peft_model = save_tiny_llama_with_adapters(base / "model", base / "root", tiny_model.tokenizer, SPECS)
    prompt = tiny_model.tokenizer.encode("Once upon a time")
    references = {name: refs[0] for name, refs in peft_references(peft_model, [prompt], TOKENS).items()}
    return load_model(str(base / "model")), base / "root", prompt, references


@pytest.fixture
def serving(world):
    """An engine server on a free port, served by a thread, with alpha@v1 loaded before it starts."""
    model, root, _, _ = world
    engine = LLMEngine(model, EngineConfig(chunk_size=CHUNK, max_chunk_per_gpu=64, max_loras=2, max_lora_rank=16, adapter_root=str(root)))
    engine.load_adapter("alpha", "v1", "alpha")
    server = EngineServer(engine, ServerSettings(port=0, bind_host="127.0.0.1", idle_poll_ms=10))
    stop = threading.Event()
    thread = threading.Thread(target=server.serve, args=(stop,), daemon=True)
    thread.start()
    client = dealer(f"tcp://127.0.0.1:{server.port}")
    yield server, client
    stop.set()
    thread.join(timeout=10)
    client.close()
    server.close()


def served_tokens(client, message) -> list[int]:
    send(client, message)
    replies = receive_until_done(client, message.generate.request_id)
    assert replies[-1].WhichOneof("kind") == "final", replies[-1]
    return [t for reply in replies[:-1] for t in reply.delta.token_ids]


def test_a_request_names_its_adapter_on_the_wire(world, serving):
    _, _, prompt, references = world
    _, client = serving
    for name in ("alpha", None):
        assert compare(served_tokens(client, adapter_request(prompt, name)), references[name]).matched == TOKENS


def test_an_adapter_version_that_is_not_loaded_is_refused(world, serving):
    _, _, prompt, _ = world
    _, client = serving
    for name, version in (("alpha", "v2"), ("beta", "v1")):
        message = adapter_request(prompt, name, version)
        send(client, message)
        (reply,) = receive_until_done(client, message.generate.request_id)
        assert reply.error.code == k25_pb2.ADAPTER_NOT_FOUND and f"{version!r}" in reply.error.message


def tokens_of_all(client, request_ids: list[str]) -> dict[str, list[int]]:
    """Every request's tokens, read until each has its Final."""
    tokens, open_ids = {rid: [] for rid in request_ids}, set(request_ids)
    while open_ids:
        message = receive(client)
        rid, kind = request_id_of(message), message.WhichOneof("kind")
        assert kind != "error", message
        if kind == "delta":
            tokens[rid] += message.delta.token_ids
        else:
            open_ids.discard(rid)
    return tokens


def test_another_thread_loads_an_adapter_between_steps_while_a_request_streams(world, serving):
    _, _, prompt, references = world
    server, client = serving
    long_request = adapter_request(prompt, "alpha", max_tokens=300)
    send(client, long_request)
    first = receive(client)  # it streams: the loads below happen between its steps
    assert first.WhichOneof("kind") == "delta"
    loaded = server.call_between_steps(lambda: server.engine.load_adapter("beta", "v1", "beta"))
    assert loaded.result(timeout=10).ref.key == "beta@v1"
    failed = server.call_between_steps(lambda: server.engine.load_adapter("gamma", "v1", "../gamma"))
    with pytest.raises(EngineError) as caught:
        failed.result(timeout=10)
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT
    beta_request = adapter_request(prompt, "beta")
    send(client, beta_request)
    tokens = tokens_of_all(client, [long_request.generate.request_id, beta_request.generate.request_id])
    tokens[long_request.generate.request_id][:0] = first.delta.token_ids
    assert compare(tokens[beta_request.generate.request_id], references["beta"]).matched == TOKENS
    long_tokens = tokens[long_request.generate.request_id]
    assert len(long_tokens) == 300 and compare(long_tokens[:TOKENS], references["alpha"]).matched == TOKENS


def test_the_heartbeat_lists_the_loaded_adapters(serving, redis_client):
    server, _ = serving
    engine = server.engine
    profile = EngineProfile(
        engine_id="e1", address="127.0.0.1:1", pool="short", node_type="cpu", model="tiny", chunk_size=CHUNK,
        max_chunk_per_gpu=engine.max_chunk_per_gpu, capacity_tokens=engine.capacity_tokens, max_model_len=engine.max_model_len,
        kv_admission_limit=0.92, max_waiting=1024, heartbeat_ttl_s=5.0,
    )
    heartbeat = Heartbeat(redis_client, "test", "e1", lambda: registry_entry(profile, server.stats), interval_s=1, ttl_s=5)
    assert heartbeat.beat()
    assert live_engines(redis_client, "test")["e1"]["adapters"] == ["alpha@v1"]
    server.call_between_steps(lambda: engine.load_adapter("beta", "v2", "beta")).result(timeout=10)
    server.call_between_steps(lambda: engine.unload_adapter("alpha", "v1")).result(timeout=10)
    server.call_between_steps(lambda: None).result(timeout=10)  # one more loop turn: stats published
    assert heartbeat.beat()
    assert live_engines(redis_client, "test")["e1"]["adapters"] == ["beta@v2"]
    heartbeat.stop()
