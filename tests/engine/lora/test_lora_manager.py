"""Slots, the CPU cache, load and unload while requests run. Outputs are checked against
transformers + peft with the same adapter, so a slot overwritten under a running request shows."""

import shutil
import time

import pytest

from engine.base.config import EngineConfig
from engine.base.errors import EngineConfigError, EngineError, ErrorCode
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import FinishReason
from engine.llm_engine import LLMEngine
from engine.lora.adapter import AdapterRef
from engine.lora.eviction import least_recent_idle
from engine.model.loader import load_model
from engine.offline import Completion, collect, make_request
from tests.helpers.lora_helpers import peft_references, save_tiny_llama_with_adapters
from tests.helpers.parity import compare

SPECS = {
    "alpha": dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "up_proj"]),
    "beta": dict(r=4, lora_alpha=8, target_modules=["o_proj", "gate_proj", "down_proj"]),
}
TOKENS = 10
GREEDY = SamplingParams(max_tokens=TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model):
    base = tmp_path_factory.mktemp("lora-manager")
    peft_model = save_tiny_llama_with_adapters(base / "model", base / "root", tiny_model.tokenizer, SPECS)
    prompt = tiny_model.tokenizer.encode("The capital of France is")
    references = peft_references(peft_model, [prompt], TOKENS)
    return load_model(str(base / "model")), base / "root", prompt, {name: refs[0] for name, refs in references.items()}


def make_engine(world, root=None, **overrides) -> LLMEngine:
    model, default_root, _, _ = world
    settings = dict(chunk_size=64, max_chunk_per_gpu=8, max_loras=1, max_lora_rank=16, adapter_root=str(root or default_root))
    return LLMEngine(model, EngineConfig(**(settings | overrides)))


class Run:
    """Requests submitted one by one, their outputs collected, and the order tokens came in."""

    def __init__(self, engine, prompt):
        self.engine, self.prompt = engine, prompt
        self.completions: dict[str, Completion] = {}
        self.token_order: list[str] = []

    def submit(self, name: str | None, version="v1", **sampling) -> str:
        request = make_request(self.engine, self.prompt, SamplingParams(**({"max_tokens": TOKENS, "ignore_eos": True} | sampling)))
        request.adapter = AdapterRef(name, version) if name else None
        self.engine.add_request(request)
        self.completions[request.request_id] = Completion(request.request_id)
        return request.request_id

    def step(self) -> None:
        outputs = self.engine.step().outputs
        collect(self.completions, outputs)
        self.token_order += [out.request_id for out in outputs if out.token_ids]

    def finish(self) -> None:
        while self.engine.has_unfinished():
            self.step()

    def served(self, request_id: str, reference) -> bool:
        """All of the request's tokens equal the reference's (no near-tie allowance needed here)."""
        return compare(self.completions[request_id].token_ids, reference).matched == TOKENS


def test_least_recent_idle_skips_busy_entries_in_lru_order():
    assert least_recent_idle([3, 1, 2], busy=set()) == 3
    assert least_recent_idle([3, 1, 2], busy={3}) == 1
    assert least_recent_idle([3, 1, 2], busy={3, 1, 2}) is None
    assert least_recent_idle([], busy=set()) is None


def test_with_one_slot_a_second_adapter_waits_until_the_first_is_idle(world):
    _, _, prompt, references = world
    engine = make_engine(world)
    engine.load_adapter("alpha", "v1", "alpha")
    engine.load_adapter("beta", "v1", "beta")
    run = Run(engine, prompt)
    first, second, base = run.submit("alpha"), run.submit("beta"), run.submit(None)
    run.step()
    assert engine.num_waiting == 1 and engine.num_running == 2  # beta waits for the slot; the base model does not
    run.finish()
    assert run.token_order.index(second) > max(i for i, r in enumerate(run.token_order) if r == first)
    for request_id, name in ((first, "alpha"), (second, "beta"), (base, None)):
        assert run.served(request_id, references[name])


def alpha_running(world, **settings) -> tuple[LLMEngine, Run, str]:
    """An engine with alpha@v1 loaded and one request for it two steps in."""
    engine = make_engine(world, **settings)
    engine.load_adapter("alpha", "v1", "alpha")
    run = Run(engine, world[2])
    request_id = run.submit("alpha")
    run.step()
    run.step()
    return engine, run, request_id


def test_loading_while_a_request_runs_never_takes_its_slot(world):
    references = world[3]
    engine, run, running = alpha_running(world)
    engine.load_adapter("beta", "v1", "beta")  # no free slot: it must not be written over alpha's
    waiting = run.submit("beta")
    run.finish()
    assert run.served(running, references["alpha"])
    assert run.served(waiting, references["beta"])


def test_unload_refuses_new_requests_and_lets_admitted_ones_finish(world):
    references = world[3]
    engine, run, running = alpha_running(world)
    assert engine.unload_adapter("alpha", "v1") is True
    assert engine.adapter_keys == [] and engine.unload_adapter("alpha", "v1") is False
    with pytest.raises(EngineError) as caught:
        run.submit("alpha")
    assert caught.value.code is ErrorCode.ADAPTER_NOT_FOUND
    run.finish()
    assert run.served(running, references["alpha"])


def test_a_version_reloaded_with_other_files_serves_them_while_earlier_requests_keep_the_old(world):
    references = world[3]
    engine, run, old = alpha_running(world, max_loras=2)
    engine.unload_adapter("alpha", "v1")
    engine.load_adapter("alpha", "v1", "beta")
    new = run.submit("alpha")
    run.finish()
    assert run.served(old, references["alpha"])
    assert run.served(new, references["beta"])


def test_an_adapter_whose_files_changed_after_leaving_the_cpu_cache_fails_and_is_unloaded(world, tmp_path):
    _, root, prompt, references = world
    shutil.copytree(root, tmp_path / "root")
    engine = make_engine(world, root=tmp_path / "root", max_cpu_loras=1)
    engine.load_adapter("alpha", "v1", "alpha")  # fills the one slot
    engine.load_adapter("beta", "v1", "beta")  # drops alpha from the CPU cache
    run = Run(engine, prompt)
    run.submit("beta")  # takes the slot from idle alpha
    run.finish()
    weights = tmp_path / "root" / "alpha" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4] + b"\x00\x00\x80\x3f")  # one float changed
    failed = run.submit("alpha")
    run.finish()
    last = run.completions[failed]
    assert last.finish_reason is FinishReason.ERROR and last.token_ids == []
    assert last.last.error.code is ErrorCode.ADAPTER_NOT_FOUND and "changed on disk" in last.last.error.message
    assert engine.adapter_keys == ["beta@v1"]


def test_an_adapter_read_again_from_disk_gives_the_same_output(world):
    _, _, prompt, references = world
    engine = make_engine(world, max_cpu_loras=1)
    engine.load_adapter("alpha", "v1", "alpha")
    engine.load_adapter("beta", "v1", "beta")
    run = Run(engine, prompt)
    ids = {run.submit("beta"): "beta", run.submit("alpha"): "alpha"}
    run.finish()
    assert engine.runner.adapters.disk_reads == 3
    for request_id, name in ids.items():
        assert run.served(request_id, references[name])


def test_a_request_waiting_for_a_slot_can_be_aborted_or_expire(world):
    _, _, prompt, _ = world
    engine = make_engine(world)
    engine.load_adapter("alpha", "v1", "alpha")
    engine.load_adapter("beta", "v1", "beta")
    run = Run(engine, prompt)
    run.submit("alpha", max_tokens=40)
    aborted, expiring = run.submit("beta"), run.submit("beta")
    engine._sequences[expiring].deadline = time.time() + 0.2
    run.step()
    assert engine.num_waiting == 2
    assert engine.abort(aborted).finish_reason is FinishReason.ABORT
    time.sleep(0.25)
    run.step()
    assert run.completions[expiring].last.error.code is ErrorCode.DEADLINE_EXCEEDED
    assert engine.num_waiting == 0
    run.finish()


def test_the_slots_count_against_the_memory_budget(world):
    model = world[0]
    without = LLMEngine(model, EngineConfig(chunk_size=64, cpu_memory_budget_gib=0.25))
    with_slots = LLMEngine(model, EngineConfig(chunk_size=64, cpu_memory_budget_gib=0.25, max_loras=16, max_cpu_loras=16))
    c, rank = model.config, 64  # the default max_lora_rank
    h, i, q, kv = c.hidden_size, c.intermediate_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    # per layer, A of q,k,v,gate,up (in: hidden), o (in: q), down (in: intermediate); B of every output
    slot_bytes = c.num_layers * rank * ((5 * h + q + i) + (q + 2 * kv + h + 2 * i + h)) * 4
    chunk_kv_bytes = 64 * c.num_layers * 2 * kv * 4
    lost = without.max_chunk_per_gpu - with_slots.max_chunk_per_gpu
    assert lost in (16 * slot_bytes // chunk_kv_bytes, 16 * slot_bytes // chunk_kv_bytes + 1)


@pytest.mark.parametrize(
    "settings, said",
    [
        (dict(max_loras=-1), "max_loras must be 0"),
        (dict(max_loras=4, max_cpu_loras=2), "max_cpu_loras (2) must be at least max_loras (4)"),
        (dict(max_lora_rank=0), "max_lora_rank must be at least 1"),
        (dict(lora_kernel="cutlass"), "lora_kernel must be one of torch, triton"),
        (dict(lora_kernel="triton"), "needs a CUDA device"),
    ],
)
def test_bad_lora_settings_stop_the_engine_from_starting(world, monkeypatch, settings, said):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(EngineConfigError) as caught:
        make_engine(world, **settings)
    assert said in str(caught.value)
