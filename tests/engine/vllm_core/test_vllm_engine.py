"""`k25 engine --backend vllm` as a real process (vLLM's CPU build, `make vllm`) behind K25's
wire: greedy parity with transformers in float32 on the parity prompts, in one continuous
batch; the same refusals as K25's engine; cancel and deadlines free the KV; the heartbeat's figures
move with load; a drain lets the running request finish. Fails, never skips, when .venv-vllm is
missing."""

import math
import signal
import time

import pytest

from engine.base.config import EngineConfig
from engine.vllm_core.settings import BLOCK_SIZE
from proto import k25_pb2
from tests.helpers.engine_frames import invalid_requests
from tests.helpers.engine_process import (
    dealer,
    generate_message,
    receive,
    receive_until_done,
    send,
    start_engine,
    wait_until,
)
from tests.helpers.parity import REFERENCE_NEW_TOKENS, compare
from tests.helpers.paths import VLLM_PYTHON
from tests.helpers.redis_server import module_redis_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow  # starts vLLM and runs SmolLM2 in float32

CHUNK = 64
MAX_CHUNKS = 40  # 2,560 tokens: the longest parity prompt and its answer fit
KV_ADMISSION_LIMIT = EngineConfig().kv_admission_limit  # the engine is started with the default


@pytest.fixture(scope="module")
def engine(tmp_path_factory, module_redis_url):  # noqa: F811
    assert VLLM_PYTHON.exists(), f"{VLLM_PYTHON} is missing: `make vllm` builds it"
    folder = tmp_path_factory.mktemp("vllm-engine")
    process = start_engine(
        module_redis_url, str(folder / "engine.log"), "--backend", "vllm", "--enforce-eager",
        "--chunk-size", str(CHUNK), "--max-chunk-per-gpu", str(MAX_CHUNKS), "--max-num-batched-tokens", "256",
        "--heartbeat-interval-s", "0.2", python=VLLM_PYTHON, timeout_s=300,
    )
    yield process
    assert process.stop() == 0, process.log()


@pytest.fixture
def client(engine):
    socket = dealer(engine.address)
    yield socket
    socket.close()


def answer(socket, prompt, **sampling) -> tuple[list[int], k25_pb2.EngineMessage]:
    message = generate_message(prompt, CHUNK, **sampling)
    send(socket, message)
    messages = receive_until_done(socket, message.generate.request_id, timeout_s=120)
    return [t for m in messages if m.HasField("delta") for t in m.delta.token_ids], messages[-1]


def test_greedy_tokens_match_transformers_in_one_batch(engine, client, smollm2_prompts, smollm2_references, parity_report):
    requests = [generate_message(p, CHUNK, max_tokens=REFERENCE_NEW_TOKENS, ignore_eos=True) for p in smollm2_prompts]
    for message in requests:  # all at once: vLLM batches their prefills and decodes together
        send(client, message)
    tokens = {m.generate.request_id: [] for m in requests}
    finals = {}
    while len(finals) < len(requests):
        message = receive(client, timeout_s=300)
        kind = message.WhichOneof("kind")
        assert kind != "error", message
        if kind == "delta":
            tokens[message.delta.request_id] += message.delta.token_ids
        else:
            finals[message.final.request_id] = message.final
    comparisons = [compare(tokens[m.generate.request_id], ref) for m, ref in zip(requests, smollm2_references)]
    near_ties = sum(c.near_tie for c in comparisons)
    parity_report.append(
        f"SmolLM2 on backend vllm, one batch, chunk {CHUNK}: {len(requests)} prompts, "
        f"{sum(c.matched for c in comparisons)} tokens equal, {near_ties} stopped at a near-tie")
    assert near_ties <= max(1, len(requests) // 4), "near-ties should be rare"
    for message, prompt in zip(requests, smollm2_prompts):
        usage = finals[message.generate.request_id].usage
        assert (usage.prompt_tokens, usage.completion_tokens) == (len(prompt), REFERENCE_NEW_TOKENS)


def test_a_repeated_prompt_is_served_from_the_prefix_cache(client, smollm2_prompts):
    prompt = max(smollm2_prompts, key=len)
    first, _ = answer(client, prompt, max_tokens=4)
    again, final = answer(client, prompt, max_tokens=4)
    assert again == first
    assert final.final.usage.cached_tokens >= len(prompt) - BLOCK_SIZE


def test_refusals_are_k25s(client, smollm2_prompts):
    for message in invalid_requests(smollm2_prompts[3], CHUNK):
        send(client, message)
        reply = receive(client)
        assert reply.WhichOneof("kind") == "error" and reply.error.code == k25_pb2.INVALID_ARGUMENT, message
    # a grammar K25's llguidance reads and vLLM's older one does not: vLLM's own refusal, the same error
    unreadable = generate_message(smollm2_prompts[3], CHUNK, max_tokens=2,
                                  constraint=k25_pb2.Constraint(lark='start: "a" ("b") ~ 0..3'))
    send(client, unreadable)
    reply = receive(client)
    assert reply.WhichOneof("kind") == "error" and reply.error.code == k25_pb2.INVALID_ARGUMENT, reply
    wrong_chunk = generate_message(smollm2_prompts[3], 32, max_tokens=2)
    send(client, wrong_chunk)
    assert receive(client).error.code == k25_pb2.CHUNK_SIZE_MISMATCH
    tokens, final = answer(client, smollm2_prompts[3], max_tokens=3)  # and it still serves
    assert final.WhichOneof("kind") == "final" and len(tokens) <= 3


def test_the_kv_guard_refuses_cancel_frees_the_kv_and_the_heartbeat_shows_the_load(engine, client, smollm2_prompts):
    # a prompt that alone fills the KV past the guard, prefilled in a few steps where decoding to
    # the guard would take hundreds; the answer may then fill the rest, as many tokens as remained
    # when decoding crossed the guard
    capacity = MAX_CHUNKS * CHUNK
    length = math.ceil(KV_ADMISSION_LIMIT * capacity / BLOCK_SIZE) * BLOCK_SIZE
    prompt = [t for p in sorted(smollm2_prompts, key=len, reverse=True) for t in p][:length]
    filling = generate_message(prompt, CHUNK, max_tokens=capacity - length, ignore_eos=True)
    send(client, filling)
    assert receive(client, timeout_s=120).WhichOneof("kind") == "delta"
    wait_until(lambda: (e := engine.registry_entry()) and int(e["running"]) == 1, what="running 1 in the heartbeat")
    # past the 92% admission guard (the answer fills the KV to its last block): a new request is refused
    wait_until(lambda: engine.registry_entry()["free_kv_fraction"] < 0.08, timeout_s=120, what="KV above 92%")
    other = generate_message(smollm2_prompts[2], CHUNK, max_tokens=2)
    send(client, other)
    refusal = receive_until_done(client, other.generate.request_id)[-1]
    assert refusal.error.code == k25_pb2.RESOURCE_EXHAUSTED, refusal
    send(client, k25_pb2.ClientMessage(cancel=k25_pb2.CancelRequest(request_id=filling.generate.request_id)))
    assert receive_until_done(client, filling.generate.request_id)[-1].final.finish_reason == k25_pb2.ABORT
    wait_until(lambda: (e := engine.registry_entry()) and int(e["running"]) == 0 and e["free_kv_fraction"] == 1,
               what="the cancelled request's KV freed")
    _, final = answer(client, smollm2_prompts[2], max_tokens=2)
    assert final.WhichOneof("kind") == "final"


def test_a_deadline_ends_the_request_and_frees_its_kv(engine, client, smollm2_prompts):
    message = generate_message(smollm2_prompts[4], CHUNK, max_tokens=1000, ignore_eos=True)
    message.generate.deadline_unix_s = time.time() + 1.0
    send(client, message)
    last = receive_until_done(client, message.generate.request_id, timeout_s=120)[-1]
    assert last.error.code == k25_pb2.DEADLINE_EXCEEDED, last
    wait_until(lambda: (e := engine.registry_entry()) and int(e["running"]) == 0 and e["free_kv_fraction"] == 1,
               what="the expired request's KV freed")


def test_last_a_drain_lets_the_running_request_finish(engine, client, smollm2_prompts):
    """Last in the module: it stops the engine."""
    message = generate_message(smollm2_prompts[4], CHUNK, max_tokens=40, ignore_eos=True)
    send(client, message)
    first = receive(client, timeout_s=120)
    assert first.WhichOneof("kind") == "delta"
    engine.process.send_signal(signal.SIGTERM)
    rest = receive_until_done(client, message.generate.request_id, timeout_s=120)
    assert rest[-1].final.finish_reason == k25_pb2.LENGTH and rest[-1].final.usage.completion_tokens == 40, rest[-1]
    assert engine.process.wait(timeout=60) == 0, engine.log()
