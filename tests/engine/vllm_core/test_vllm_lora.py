"""LoRA through the vLLM backend: a `k25 engine --backend vllm` process follows the rollout state
in Redis as K25's engine does (hot load and unload by name@version, the sha256 checked before
loading), and serves peft's adapters with transformers + peft's greedy tokens."""

import pytest

from common.rollout_keys import PROGRESSING, RolloutState, release_rollout, write_rollout
from tests.helpers.engine_process import RELEASE, dealer, receive_until_done, send, start_engine, wait_until
from tests.helpers.lora_helpers import adapter_request, checksum, peft_references, save_tiny_llama_with_adapters
from tests.helpers.parity import compare
from tests.helpers.paths import VLLM_PYTHON
from tests.helpers.redis_server import module_redis_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

CHUNK = 32
TOKENS = 8
SPECS = {
    "legal1": dict(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
    "legal2": dict(r=16, lora_alpha=16, target_modules=["o_proj", "gate_proj", "up_proj", "down_proj"]),
}
# vLLM's CPU attention takes heads of 32 or more: 2 heads of 64
SHAPE = dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, intermediate_size=256)


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model):
    base = tmp_path_factory.mktemp("vllm-lora")
    peft_model = save_tiny_llama_with_adapters(base / "model", base / "root", tiny_model.tokenizer, SPECS, **SHAPE)
    prompt = tiny_model.tokenizer.encode("Once upon a time")
    references = {name: refs[0] for name, refs in peft_references(peft_model, [prompt], TOKENS).items()}
    return base, prompt, references


@pytest.fixture(scope="module")
def engine(world, module_redis_url):  # noqa: F811
    assert VLLM_PYTHON.exists(), f"{VLLM_PYTHON} is missing: `make vllm` builds it"
    base, _, _ = world
    process = start_engine(module_redis_url, str(base / "engine.log"), "--backend", "vllm", "--enforce-eager",
                           "--model", str(base / "model"), "--chunk-size", str(CHUNK), "--max-chunk-per-gpu", "16",
                           "--max-loras", "2", "--max-lora-rank", "16", "--adapter-root", str(base / "root"),
                           python=VLLM_PYTHON, timeout_s=300)
    yield process
    assert process.stop() == 0, process.log()


def rollout_of(base, stable, canary="", weight=0, stable_sha=None) -> RolloutState:
    def version(name, sha=None):
        return (name, name, sha or checksum(base / "root" / name)) if name else ("", "", "")
    return RolloutState(*version(stable, stable_sha), *version(canary), weight, (), PROGRESSING if canary else "Stable")


def served(client, prompt, version: str | None):
    message = adapter_request(prompt, "legal" if version else None, version or "v1", chunk_size=CHUNK)
    send(client, message)
    replies = receive_until_done(client, message.generate.request_id, timeout_s=120)
    if replies[-1].WhichOneof("kind") == "error":
        return replies[-1].error.message
    return [t for reply in replies[:-1] for t in reply.delta.token_ids]


def test_a_bad_checksum_is_not_loaded(world, engine):
    """First: nothing is loaded yet."""
    base, prompt, _ = world
    write_rollout(engine.redis, RELEASE, "legal", rollout_of(base, "legal1", stable_sha="0" * 64))
    wait_until(lambda: "expected " + "0" * 64 in engine.log(), what="the checksum mismatch logged")
    assert engine.registry_entry()["adapters"] == []
    assert "not loaded" in served(dealer(engine.address), prompt, "legal1")


def test_adapters_follow_the_rollout_and_answer_as_peft_does(world, engine):
    base, prompt, references = world
    client = dealer(engine.address)
    write_rollout(engine.redis, RELEASE, "legal", rollout_of(base, "legal1"))
    wait_until(lambda: engine.registry_entry()["adapters"] == ["legal@legal1"], what="the stable version loaded")
    write_rollout(engine.redis, RELEASE, "legal", rollout_of(base, "legal1", "legal2", 5))
    wait_until(lambda: engine.registry_entry()["adapters"] == ["legal@legal1", "legal@legal2"], what="the canary loaded")
    for version in ("legal1", "legal2", None):
        tokens = served(client, prompt, version)
        assert compare(tokens, references[version]).matched == TOKENS, version
    assert references["legal1"].token_ids != references["legal2"].token_ids  # the adapters change the answer
    write_rollout(engine.redis, RELEASE, "legal", rollout_of(base, "legal2"))  # promoted: the old version goes
    wait_until(lambda: engine.registry_entry()["adapters"] == ["legal@legal2"], what="the old version unloaded")
    assert "not loaded" in served(client, prompt, "legal1")
    release_rollout(engine.redis, RELEASE, "legal", "test/legal/uid")
    wait_until(lambda: engine.registry_entry()["adapters"] == [], what="the adapter unloaded with its rollout")
    client.close()
