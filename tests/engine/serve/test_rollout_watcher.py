"""The rollout watcher against a private redis-server and a real engine server (a tiny Llama
with PEFT adapters): a Redis that restarts empty unloads nothing, an announced deletion does;
an unexpected exception does not end the watcher; adapter files are read off the serving
thread (a FIFO that only yields its bytes when the test writes them); a load that failed is
tried again without a new announcement."""

import logging
import os
import shutil
import threading
from dataclasses import dataclass

import pytest
import redis

from common.rollout_keys import RolloutState, release_rollout, rollout_channel, rollout_key, write_rollout
from engine.base.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.model.loader import load_model
from engine.serve.heartbeat import registry_client
from engine.serve.rollout_watcher import RolloutWatcher
from engine.serve.server import EngineServer, ServerSettings
from tests.helpers.engine_process import dealer, receive_until_done, send, wait_until
from tests.helpers.lora_helpers import adapter_request, checksum, save_tiny_llama_with_adapters
from tests.helpers.redis_server import free_port, start_redis_server

RELEASE = "test"
SPECS = {"legal1": dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])}


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model):
    base = tmp_path_factory.mktemp("rollout-watcher")
    save_tiny_llama_with_adapters(base / "model", base / "root", tiny_model.tokenizer, SPECS)
    return load_model(str(base / "model")), base / "root", tiny_model.tokenizer.encode("Once upon a time")


@dataclass
class Watching:
    server: EngineServer
    watcher: RolloutWatcher
    redis: redis.Redis
    redis_port: int
    redis_process: object
    root: object

    def adapters(self) -> tuple[str, ...]:
        return self.server.stats.adapters  # the serving thread's snapshot

    def wait_for_adapters(self, *expected: str) -> None:
        wait_until(lambda: self.adapters() == expected, timeout_s=60, what=f"the engine holding {expected}")

    def restart_redis_empty(self) -> None:
        self.redis_process.kill()
        self.redis_process.wait()
        self.redis_process = start_redis_server(self.redis_port)


@pytest.fixture
def watching(world):
    model, root, _ = world
    port = free_port()
    redis_process = start_redis_server(port)
    url = f"redis://127.0.0.1:{port}/0"
    engine = LLMEngine(model, EngineConfig(chunk_size=32, max_chunk_per_gpu=64, max_loras=2, max_lora_rank=16,
                                           adapter_root=str(root)))
    server = EngineServer(engine, ServerSettings(port=0, bind_host="127.0.0.1", idle_poll_ms=10))
    stop = threading.Event()
    thread = threading.Thread(target=server.serve, args=(stop,), daemon=True)
    thread.start()
    watcher = RolloutWatcher(registry_client(url), RELEASE, server, retry_s=0.05, max_retry_s=0.2)
    watcher.start()
    watching = Watching(server, watcher, redis.Redis.from_url(url), port, redis_process, root)
    yield watching
    watcher.stop()
    stop.set()
    thread.join(timeout=30)
    server.close()
    watching.redis_process.kill()
    watching.redis_process.wait()


def version_from(root, folder: str, version: str | None = None) -> RolloutState:
    """A rollout whose stable version is `version` (default: the folder's name), read from `folder`
    with the checksum of legal1's files."""
    return RolloutState(version or folder, folder, checksum(root / "legal1"))


def served(server: EngineServer, prompt, version: str | None) -> str:
    client = dealer(f"tcp://127.0.0.1:{server.port}")
    message = adapter_request(prompt, "legal" if version else None, version or "", max_tokens=2)
    send(client, message)
    last = receive_until_done(client, message.generate.request_id)[-1]
    client.close()
    return last.WhichOneof("kind")


def test_a_redis_that_comes_back_empty_unloads_nothing_and_an_announced_deletion_does(watching, caplog):
    write_rollout(watching.redis, RELEASE, "legal", version_from(watching.root, "legal1"))
    watching.wait_for_adapters("legal@legal1")

    with caplog.at_level(logging.WARNING, logger="engine.serve.rollout_watcher"):
        watching.restart_redis_empty()
        wait_until(lambda: any("no rollout state for adapter legal" in r.message for r in caplog.records),
                   timeout_s=60, what="the watcher reconciling with the empty Redis")
    assert watching.adapters() == ("legal@legal1",)

    release_rollout(watching.redis, RELEASE, "legal", "test/legal/uid")  # announced: a deletion, though there was nothing left to delete
    watching.wait_for_adapters()


def test_an_unexpected_error_is_logged_with_its_traceback_and_the_watcher_goes_on(watching, caplog):
    write_rollout(watching.redis, RELEASE, "legal", version_from(watching.root, "legal1"))
    watching.wait_for_adapters("legal@legal1")

    with caplog.at_level(logging.ERROR, logger="engine.serve.rollout_watcher"):
        # a path with a NUL byte is a state within the contract, but no file system takes it
        write_rollout(watching.redis, RELEASE, "legal", version_from(watching.root, "legal\x00", "nul"))
        record = wait_until(lambda: next((r for r in caplog.records if "goes on" in r.message), None),
                            timeout_s=60, what="the watcher logging the error")
    assert record.exc_info is not None and isinstance(record.exc_info[1], ValueError)

    shutil.copytree(watching.root / "legal1", watching.root / "legal9", dirs_exist_ok=True)
    write_rollout(watching.redis, RELEASE, "legal", version_from(watching.root, "legal9"))  # a good state again
    watching.wait_for_adapters("legal@legal9")
    assert watching.watcher._thread.is_alive()


def test_adapter_files_are_read_off_the_serving_thread(watching, world):
    _, root, prompt = world
    folder = root / "from-a-fifo"
    folder.mkdir(exist_ok=True)
    shutil.copy(root / "legal1" / "adapter_config.json", folder)
    fifo = folder / "adapter_model.safetensors"
    if fifo.exists():
        fifo.unlink()
    os.mkfifo(fifo)
    write_rollout(watching.redis, RELEASE, "legal", version_from(root, "from-a-fifo", "slow"))

    def fifo_reader_waiting():
        try:  # opening a FIFO's write end without blocking works only while a reader has it open
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return None

    fd = wait_until(fifo_reader_waiting, timeout_s=60, what="the watcher reading the adapter's weights")
    assert served(watching.server, prompt, None) == "final"  # the engine serves while the read waits
    assert watching.adapters() == ()

    os.set_blocking(fd, True)
    with os.fdopen(fd, "wb") as writer:
        writer.write((root / "legal1" / "adapter_model.safetensors").read_bytes())
    watching.wait_for_adapters("legal@slow")
    assert served(watching.server, prompt, "slow") == "final"


def test_a_load_that_failed_is_tried_again_without_a_new_announcement(watching, caplog):
    root = watching.root
    shutil.rmtree(root / "not-there-yet", ignore_errors=True)
    with caplog.at_level(logging.ERROR, logger="engine.serve.rollout_watcher"):
        write_rollout(watching.redis, RELEASE, "legal", version_from(root, "not-there-yet", "later"))
        wait_until(lambda: any("cannot load adapter legal@later" in r.message for r in caplog.records),
                   timeout_s=60, what="the failed load logged")
    shutil.copytree(root / "legal1", root / "not-there-yet")  # e.g. a volume that syncs late
    watching.wait_for_adapters("legal@later")


def test_a_malformed_rollout_index_member_costs_only_its_own_adapter(watching, world, caplog):
    """A member of {release}:rollout_adapters that breaks the contract (an unusable name, or a hash
    without the fields) is logged and skipped when the watcher reconciles; every other adapter
    still loads (before, the first one stopped every load)."""
    _, root, prompt = world
    watching.redis.sadd(f"{RELEASE}:rollout_adapters", "bad@name", "broken")
    watching.redis.hset(rollout_key(RELEASE, "broken"), mapping={"stable": ""})
    with caplog.at_level(logging.ERROR, logger="engine.serve.rollout_watcher"):
        write_rollout(watching.redis, RELEASE, "legal", version_from(root, "legal1", "v1"))
        watching.redis.client_kill_filter(_type="pubsub")  # the watcher subscribes again and reconciles every adapter
        watching.wait_for_adapters("legal@v1")
        wait_until(lambda: "bad@name" in caplog.text and "broken" in caplog.text, timeout_s=30,
                   what="the malformed members logged")
    assert served(watching.server, prompt, "v1") == "final"


def test_rollout_states_that_are_not_text_cost_only_their_own_adapters_and_are_counted(watching, world, caplog):
    """An index member that is not UTF-8, a hash with a field that is not, and an announcement of
    either are skipped, logged once and counted; every other adapter loads and the subscription
    stays (before, reading them raised out of every reconcile, so no adapter loaded at all)."""
    _, root, prompt = world
    watching.redis.sadd(f"{RELEASE}:rollout_adapters", b"\xff\xfe", "garbled")
    watching.redis.hset(rollout_key(RELEASE, "garbled"), "stable_source", b"\xff\xfe")
    with caplog.at_level(logging.INFO, logger="engine.serve.rollout_watcher"):
        write_rollout(watching.redis, RELEASE, "legal", version_from(root, "legal1", "v1"))
        watching.redis.client_kill_filter(_type="pubsub")  # the watcher subscribes again and reconciles every adapter
        watching.wait_for_adapters("legal@v1")
        unusable = watching.server.metrics.unusable_rollout_states
        wait_until(lambda: unusable._value.get() == 2, timeout_s=30, what="the two unusable states counted")
        watching.redis.publish(rollout_channel(RELEASE), b"\xff\xfe")  # announced: skipped again, not resubscribed
        watching.redis.publish(rollout_channel(RELEASE), "garbled")
        shutil.copytree(root / "legal1", root / "legal2", dirs_exist_ok=True)
        write_rollout(watching.redis, RELEASE, "legal", version_from(root, "legal2", "v2"))
        watching.wait_for_adapters("legal@v2")
    skipped = [r.message for r in caplog.records if "unusable" in r.message]
    assert len(skipped) == 2 and "garbled" in skipped[1] and "not UTF-8" in skipped[1]
    assert not any("goes on" in r.message for r in caplog.records)
    assert unusable._value.get() == 2
    assert served(watching.server, prompt, "v2") == "final"
