"""An engine that fails every request at once, with real processes: two `k25 engine`s serving
the adapter legal@v1 on a tiny Llama, one of them failing each of its requests with
INTERNAL (--inject-fault), behind `k25 gateway`.

Failing fast, that engine looks idle; routing must not make it a black hole. A request it
fails before the first token is tried once more on the other engine, and once it has failed,
the gateway sends it nothing more while the other engine takes the requests. A request every
engine fails is tried on two engines, not on all of them."""

import asyncio
import re
import time
import urllib.request
import uuid
from dataclasses import replace

import openai
import pytest

from common.rollout_keys import RolloutState, write_rollout
from proto import k25_pb2
from services.gateway.canary import STABLE, AdapterChoice
from services.gateway.dispatch import Dispatcher, Job
from services.gateway.engine_client import EngineConnections
from services.gateway.engine_errors import RecentErrors
from services.gateway.errors import OpenAIError
from services.gateway.metrics import GatewayMetrics
from services.gateway.routing import EngineView
from tests.helpers.engine_process import RELEASE, start_engine, wait_until
from tests.helpers.gateway_process import start_gateway
from tests.helpers.lora_helpers import checksum, save_tiny_llama_with_adapters
from tests.helpers.redis_server import module_redis_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

SPECS = {"legal-v1": dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])}
CHUNK = "32"


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model, module_redis_url):  # noqa: F811
    base = tmp_path_factory.mktemp("health-routing")
    save_tiny_llama_with_adapters(base / "model", base / "root", tiny_model.tokenizer, SPECS)
    flags = ("--model", str(base / "model"), "--chunk-size", CHUNK, "--max-loras", "2", "--adapter-root", str(base / "root"))
    engines = {"faulty": start_engine(module_redis_url, str(base / "faulty.log"), *flags, "--inject-fault=legal@v1",
                                      engine_id="faulty")}
    try:
        engines["good"] = start_engine(module_redis_url, str(base / "good.log"), *flags, engine_id="good")
        stable = RolloutState("v1", "legal-v1", checksum(base / "root" / "legal-v1"))
        write_rollout(engines["good"].redis, RELEASE, "legal", stable)
        for engine in engines.values():
            wait_until(lambda: engine.registry_entry()["adapters"] == ["legal@v1"], timeout_s=60, what="legal@v1 loaded")
        yield base, engines
    finally:
        for engine in engines.values():
            engine.stop()


@pytest.fixture(scope="module")
def gateway(world, module_redis_url):  # noqa: F811
    base, _ = world
    # errors count for an hour: however slow this machine is, the test runs inside the window
    service = start_gateway(module_redis_url, str(base / "gateway.log"), "--engine-error-window-s", "3600",
                            model=str(base / "model"))
    yield service
    service.stop()


def gateway_metric(gateway, name: str) -> float:
    with urllib.request.urlopen(f"{gateway.url}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_an_engine_failing_every_request_fast_gets_none_once_it_has_failed(gateway):
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=120)
    # prompts shorter than a KV block: no cached prefix draws a request to either engine
    for i in range(8):
        if i % 2:
            stream = client.completions.create(model="legal", prompt=f"Clause {i}", max_tokens=2, stream=True)
            assert [chunk.choices[0].finish_reason for chunk in stream][-1] is not None
        else:
            assert client.completions.create(model="legal", prompt=f"Clause {i}", max_tokens=2).usage.completion_tokens
    # idle engines take turns, so the faulty one was first for one of the first two requests;
    # that request was tried again on the other engine, and no later request went to it first
    assert gateway_metric(gateway, 'k25_gateway_engine_retries_total{reason="internal"}') == 1


def open_on(views: list[EngineView]) -> tuple[OpenAIError, dict[str, int], GatewayMetrics]:
    """Open a request for legal@v1 on these engines: the error it ends with, the errors
    recorded per engine, and the metrics. Whatever the engines answered, no prefill is left
    counted against them (routing would shun them for work they never took)."""
    async def scenario():
        connections = EngineConnections()
        errors, metrics = RecentErrors(3600), GatewayMetrics()
        dispatcher = Dispatcher(connections, pad_token_id=0, errors=errors, metrics=metrics)
        job = Job(request_id=uuid.uuid4().hex, tenant="tests", model="legal", prompt_token_ids=[5, 6, 7],
                  sampling=k25_pb2.SamplingParams(max_tokens=2), deadline=time.time() + 120,
                  adapter=AdapterChoice("legal", "v1", STABLE))
        try:
            with pytest.raises(OpenAIError) as failed:
                await dispatcher.open(job, views)
        finally:
            await connections.close()
        assert dispatcher.unprefilled == {}
        return failed.value, errors.counts(time.time()), metrics

    return asyncio.run(scenario())


def test_a_request_every_engine_fails_is_tried_on_two_engines_only(world):
    """Three routes to failing engines (the faulty engine's entry under three ids): the request
    fails with the engine's error after the second, and the third is never asked."""
    _, engines = world
    faulty = EngineView.from_entry("faulty", engines["faulty"].registry_entry())
    error, counts, metrics = open_on([replace(faulty, engine_id=f"faulty-{i}") for i in range(3)])
    assert error.status == 500 and error.code == "engine_error"
    assert sorted(counts.values()) == [1, 1]  # two of the three were asked, each once
    assert metrics.engine_retries.labels("internal")._value.get() == 1


def test_a_request_the_only_engine_fails_gets_its_error_not_a_503(world):
    _, engines = world
    error, counts, metrics = open_on([EngineView.from_entry("faulty", engines["faulty"].registry_entry())])
    assert error.status == 500 and error.code == "engine_error" and counts == {"faulty": 1}
    assert metrics.engine_retries.labels("internal")._value.get() == 0
