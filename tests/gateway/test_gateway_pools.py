"""Two pools with different chunk_size under one `k25 up`: the gateway routes by prompt
length, engines refuse prompts padded for another pool, and pads never change the output."""

import signal
import time

import pytest
import redis

from common.redis_keys import live_engines
from common.tokenizer import load_tokenizer
from proto import k25_pb2
from tests.helpers.engine_process import (
    RELEASE,
    STACK_CURVE_ENV,
    STACK_CURVE_KEY,
    dealer,
    generate_message,
    receive_until_done,
    send,
)
from tests.helpers.gateway_process import http_json, start_stack
from tests.helpers.redis_server import module_redis_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(tmp_path_factory, module_redis_url):  # noqa: F811
    folder = tmp_path_factory.mktemp("pools")
    service = start_stack(str(folder / "up.log"), "--model", "tiny-random", "--pool", "short=64", "--pool", "long=256",
                          "--redis-url", module_redis_url, "--release", RELEASE, "--log-dir", str(folder),
                          env=STACK_CURVE_ENV)
    yield service
    service.stop(signal.SIGINT)


@pytest.fixture(scope="module")
def db(module_redis_url):  # noqa: F811
    return redis.Redis.from_url(module_redis_url)


@pytest.fixture(scope="module")
def engines(stack, db):
    """pool -> registry entry."""
    return {entry["pool"]: entry for entry in live_engines(db, RELEASE).values()}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny-random")


def requests_counted(db, pool: str) -> int:
    return sum(int(db.get(key)) for key in db.scan_iter(f"{RELEASE}:qps:{pool}:*"))


def complete(stack, prompt, max_tokens=6):
    status, _, body = http_json(f"{stack.url}/v1/completions",
                                {"model": "tiny-random", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    assert status == 200, body
    return body


def test_both_pools_are_up(engines):
    assert {pool: entry["chunk_size"] for pool, entry in engines.items()} == {"short": 64, "long": 256}


def test_routing_by_prompt_length(stack, db):
    short_prompt = list(range(1000, 1020))  # 20 tokens: one 64-token chunk holds it
    long_prompt = list(range(1000, 1100))  # 100 tokens: only a 256-token chunk holds it whole
    before = {pool: requests_counted(db, pool) for pool in ("short", "long")}
    complete(stack, short_prompt)
    complete(stack, short_prompt)
    complete(stack, long_prompt)
    time.sleep(1.5)  # the gateway writes its counts once a second
    after = {pool: requests_counted(db, pool) for pool in ("short", "long")}
    assert after["short"] - before["short"] == 2
    assert after["long"] - before["long"] == 1


def test_a_prompt_padded_for_the_other_pool_is_refused(engines):
    socket = dealer(f"tcp://{engines['long']['address']}", STACK_CURVE_KEY)
    message = generate_message([5, 6, 7], chunk_size=64, max_tokens=2)  # 64 is not a multiple of 256
    send(socket, message)
    [error] = receive_until_done(socket, message.generate.request_id)
    assert error.error.code == k25_pb2.CHUNK_SIZE_MISMATCH
    socket.close()


def test_pads_never_change_the_output(stack, engines, tokenizer):
    prompt = list(range(2000, 2030))
    outputs = {}
    for pool, entry in engines.items():
        socket = dealer(f"tcp://{entry['address']}", STACK_CURVE_KEY)
        message = generate_message(prompt, chunk_size=entry["chunk_size"], pad_token_id=2, max_tokens=12, ignore_eos=True)
        send(socket, message)
        messages = receive_until_done(socket, message.generate.request_id)
        assert messages[-1].final.usage.pad_tokens == entry["chunk_size"] - len(prompt)
        outputs[pool] = [t for m in messages if m.WhichOneof("kind") == "delta" for t in m.delta.token_ids]
        socket.close()
    assert outputs["short"] == outputs["long"] and len(outputs["short"]) == 12  # 34 pads vs 226 pads
    # and the gateway, which pads for whichever pool it picks, gives that same text
    answer = complete(stack, prompt, max_tokens=12)
    produced = outputs["short"][: answer["usage"]["completion_tokens"]]
    if answer["choices"][0]["finish_reason"] == "stop":
        produced = produced[:-1]  # the end-of-sequence token is not text
    assert answer["choices"][0]["text"] == tokenizer.decode(produced)
