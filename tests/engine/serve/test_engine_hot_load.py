"""Hot-loading adapters from the rollout state in Redis: what to load and unload as a pure
function, then a real `k25 engine` process that follows rollout announcements while serving."""

import threading
import time

import pytest

from common.rollout_keys import PROGRESSING, RolloutState, release_rollout, write_rollout
from engine.serve.rollout_watcher import adapter_changes
from tests.helpers.engine_process import dealer, receive_until_done, send, start_engine, wait_until
from tests.helpers.lora_helpers import adapter_request, checksum, peft_references, save_tiny_llama_with_adapters
from tests.helpers.redis_server import module_redis_url  # noqa: F401  (fixture)

SHA = "b" * 64
SPECS = {
    "legal1": dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
    "legal2": dict(r=16, lora_alpha=16, target_modules=["o_proj", "down_proj"]),
}


def state(stable="v1", canary="", weight=0) -> RolloutState:
    canary_fields = (canary, f"legal/{canary}", SHA) if canary else ("", "", "")
    return RolloutState(stable, f"legal/{stable}", SHA, *canary_fields, weight, (), PROGRESSING if canary else "Stable")


@pytest.mark.parametrize("rollout, held, to_load, to_unload", [
    (state(), set(), [("v1", "legal/v1", SHA)], []),
    (state(), {"v1"}, [], []),
    (state(canary="v2", weight=5), {"v1"}, [("v2", "legal/v2", SHA)], []),
    (state(stable="v2"), {"v1", "v2"}, [], ["v1"]),  # promoted: the old stable goes
    (state(), {"v1", "v2"}, [], ["v2"]),  # rolled back: the canary goes
    (None, {"v1", "v2"}, [], ["v1", "v2"]),  # the rollout was deleted
])
def test_adapter_changes(rollout, held, to_load, to_unload):
    assert adapter_changes(rollout, held) == (to_load, to_unload)


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model):
    base = tmp_path_factory.mktemp("hot-load")
    peft_model = save_tiny_llama_with_adapters(base / "model", base / "root", tiny_model.tokenizer, SPECS)
    prompt = tiny_model.tokenizer.encode("Once upon a time")
    references = {name: refs[0].token_ids for name, refs in peft_references(peft_model, [prompt], 8).items()}
    return base, prompt, references


@pytest.fixture(scope="module")
def engine(world, module_redis_url):  # noqa: F811
    base, _, _ = world
    process = start_engine(module_redis_url, str(base / "engine.log"), "--model", str(base / "model"), "--chunk-size", "32",
                           "--max-loras", "2", "--adapter-root", str(base / "root"))
    yield process
    process.stop()


def rollout_of(base, stable, canary="", weight=0) -> RolloutState:
    def version(name):
        return (name, name, checksum(base / "root" / name)) if name else ("", "", "")
    return RolloutState(*version(stable), *version(canary), weight, (), PROGRESSING if canary else "Stable")


def served(client, prompt, version: str) -> list[int] | str:
    message = adapter_request(prompt, "legal", version)
    send(client, message)
    replies = receive_until_done(client, message.generate.request_id)
    if replies[-1].WhichOneof("kind") == "error":
        return replies[-1].error.message
    return [t for reply in replies[:-1] for t in reply.delta.token_ids]


@pytest.mark.slow
def test_the_engine_follows_the_rollout_state_while_serving(world, engine):
    base, prompt, references = world
    client = dealer(engine.address)
    from tests.helpers.engine_process import RELEASE

    write_rollout(engine.redis, RELEASE, "legal", rollout_of(base, "legal1"))
    wait_until(lambda: engine.registry_entry()["adapters"] == ["legal@legal1"], what="the stable version loaded")
    assert served(client, prompt, "legal1") == references["legal1"]

    # a canary announced while requests stream on the stable version: none fails or changes adapter
    results, stop = [], threading.Event()

    def traffic():
        local = dealer(engine.address)
        while not stop.is_set():
            results.append(served(local, prompt, "legal1"))
        local.close()

    worker = threading.Thread(target=traffic)
    worker.start()
    wait_until(lambda: results, what="requests streaming on the stable version")
    announced = time.perf_counter()
    write_rollout(engine.redis, RELEASE, "legal", rollout_of(base, "legal1", "legal2", 5))
    while isinstance(answer := served(client, prompt, "legal2"), str):  # ADAPTER_NOT_FOUND until it is loaded
        assert "not" in answer
    ready_ms = (time.perf_counter() - announced) * 1000
    print(f"\nannouncement to first request served on the new version: {ready_ms:.0f} ms")
    assert answer == references["legal2"]

    # promoted: the canary becomes stable and the old version goes
    write_rollout(engine.redis, RELEASE, "legal", rollout_of(base, "legal2"))
    wait_until(lambda: engine.registry_entry()["adapters"] == ["legal@legal2"], what="the old version unloaded")
    stop.set()
    worker.join(timeout=30)
    on_stable = [r for r in results if not isinstance(r, str)]
    assert on_stable and all(r == references["legal1"] for r in on_stable), [r for r in on_stable if r != references["legal1"]][:2]
    refused = [r for r in results if isinstance(r, str)]
    assert all("not loaded" in r for r in refused), refused[:3]  # sent after the unload: refused whole

    release_rollout(engine.redis, RELEASE, "legal", "test/legal/uid")
    wait_until(lambda: engine.registry_entry()["adapters"] == [], what="the adapter unloaded with its rollout")
    client.close()


@pytest.mark.slow
def test_a_bad_checksum_is_not_loaded_and_the_engine_keeps_serving(world, engine):
    base, prompt, references = world
    from tests.helpers.engine_process import RELEASE

    bad = RolloutState("legal1", "legal1", "0" * 64)
    write_rollout(engine.redis, RELEASE, "legal", bad)
    wait_until(lambda: "expected " + "0" * 64 in engine.log(), what="the checksum mismatch logged")
    assert engine.registry_entry()["adapters"] == []
    client = dealer(engine.address)
    assert served(client, prompt, "legal1") != references["legal1"]  # refused, not served
    release_rollout(engine.redis, RELEASE, "legal", "test/legal/uid")
    client.close()
