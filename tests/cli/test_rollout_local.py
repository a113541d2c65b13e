"""A LoRA canary end to end on one machine: `k25 up` with 2 engines serving adapters, user
traffic through the gateway, and `k25 rollout` stepping an AdapterRollout manifest. A healthy
canary walks 5 -> 20 -> 50 -> 100 and is promoted; one whose requests fail (the engines'
--inject-fault) is rolled back and its traffic returns to stable."""

import signal
import subprocess
import sys
import threading
import time

import pytest
import yaml

from tests.helpers.engine_process import RELEASE, wait_until
from tests.helpers.gateway_process import http_json, start_stack
from tests.helpers.lora_helpers import checksum, save_tiny_llama_with_adapters
from tests.helpers.redis_server import module_redis_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

SPECS = {f"legal-{v}": dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]) for v in ("v1", "v2", "v3")}


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model, module_redis_url):  # noqa: F811
    base = tmp_path_factory.mktemp("rollout")
    save_tiny_llama_with_adapters(base / "model", base / "root", tiny_model.tokenizer, SPECS)
    stack = start_stack(str(base / "up.log"), "--model", str(base / "model"), "--engines", "2", "--log-dir", str(base),
                        "--adapter-root", str(base / "root"), "--redis-url", module_redis_url, "--release", RELEASE,
                        "--engine-flag=--inject-fault=legal@v3")
    yield base, stack, module_redis_url
    stack.stop(signal.SIGINT)


def manifest(base, stable: str, canary: str, canary_sha256: str | None = None) -> str:
    def version(v):
        return {"version": v, "source": f"legal-{v}", "sha256": checksum(base / "root" / f"legal-{v}")}

    path = base / f"rollout-{canary}-{canary_sha256 is None}.yaml"
    path.write_text(yaml.safe_dump({
        "apiVersion": "k25.io/v1alpha1", "kind": "AdapterRollout", "metadata": {"name": "legal"},
        "spec": {"adapter": "legal", "pool": "default", "stable": version(stable),
                 "canary": {**version(canary), **({"sha256": canary_sha256} if canary_sha256 else {})},
                 "steps": [5, 20, 50, 100], "interval": 3, "maxErrorRate": 0.05, "maxP95LatencyMs": 10000,
                 "minRequestsPerStep": 3, "failureThreshold": 2,
                 "allowList": [f"user-{i}" for i in range(10)]},  # canary traffic at every step, however slow
    }))
    return str(path)


class Traffic:
    """Users user-0..user-99 asking the adapter `legal` through the gateway, in two threads."""

    def __init__(self, url: str):
        self.url, self.stop = url, threading.Event()
        self.outcomes: list[tuple[float, int]] = []  # (when the request was sent, its status), as answers come
        self.threads = [threading.Thread(target=self._run, args=(t,)) for t in range(2)]

    @property
    def results(self) -> list[int]:
        return [status for _, status in self.outcomes]

    def sent_after(self, moment: float) -> list[int]:
        """The statuses of the requests sent after `moment` (one sent before may answer after it)."""
        return [status for sent, status in self.outcomes if sent > moment]

    def _run(self, offset: int):
        i = offset
        while not self.stop.is_set():
            body = {"model": "legal", "prompt": "Clause 4.2", "max_tokens": 2, "user": f"user-{i % 100}"}
            sent = time.monotonic()
            self.outcomes.append((sent, http_json(f"{self.url}/v1/completions", body)[0]))
            i += 2

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)


def start_rollout(redis_url, path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "k25.cli", "rollout", path, "--redis-url", redis_url, "--release", RELEASE],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def engines_hold(stack, wanted: set[str]) -> bool:
    models = {m["id"] for m in http_json(f"{stack.url}/v1/models")[2]["data"]}
    return {m for m in models if m.startswith("legal@")} == wanted


def test_a_healthy_canary_is_promoted_then_a_failing_one_rolled_back(world):
    base, stack, redis_url = world
    walk = start_rollout(redis_url, manifest(base, "v1", "v2"))
    wait_until(lambda: engines_hold(stack, {"legal@v1", "legal@v2"}), timeout_s=30, what="both versions served")
    with Traffic(stack.url) as traffic:
        output = walk.communicate(timeout=300)[0]
    print(output)
    assert walk.returncode == 0, output
    weights = [line.split("canary at ")[1].split("%")[0] for line in output.splitlines() if "canary at" in line]
    assert weights == ["5", "20", "50", "100"], output
    assert "v2 promoted to stable" in output
    assert set(traffic.results) == {200}  # nobody saw an error while versions switched
    wait_until(lambda: engines_hold(stack, {"legal@v2"}), timeout_s=20, what="v1 unloaded everywhere")

    with Traffic(stack.url) as traffic:
        walk = start_rollout(redis_url, manifest(base, "v2", "v3"))
        output = walk.communicate(timeout=300)[0]
        print(output)
        assert walk.returncode == 3, output
        assert "rolled back to v2 after 2 failed checks" in output and "error rate" in output
        failed_during_rollout = len([s for s in traffic.results if s != 200])
        wait_until(lambda: engines_hold(stack, {"legal@v2"}), timeout_s=20, what="v3 unloaded everywhere")
        unloaded_at = time.monotonic()
        wait_until(lambda: len(traffic.sent_after(unloaded_at)) > 20, timeout_s=30, what="more traffic")
    assert failed_during_rollout > 0  # the canary's users did see its failures
    assert set(traffic.sent_after(unloaded_at)) == {200}  # and then everyone is back on stable


def test_a_canary_that_cannot_load_is_rolled_back(world):
    """A wrong checksum: no engine loads it, its users stay on stable, and it is rolled back."""
    base, stack, redis_url = world
    with Traffic(stack.url) as traffic:
        walk = start_rollout(redis_url, manifest(base, "v2", "v1", canary_sha256="0" * 64))
        output = walk.communicate(timeout=300)[0]
    print(output)
    assert walk.returncode == 3, output
    assert "legal@v1 is loaded on no engine of pool default" in output
    assert set(traffic.results) == {200}  # nobody was sent to it
