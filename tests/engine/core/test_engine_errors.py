"""Error paths of the engine: each gives its code, frees what it held, and the engine keeps serving."""

import time

import pytest

from engine.base.config import EngineConfig
from engine.base.errors import EngineConfigError, EngineError, ErrorCode
from engine.core.admission import check_room
from engine.core.request import EngineRequest
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import FinishReason
from engine.llm_engine import LLMEngine
from engine.offline import Completion, collect, generate, make_request

CHUNK = 32


@pytest.fixture(scope="module")
def engine(tiny_model):
    return LLMEngine(tiny_model, EngineConfig(chunk_size=CHUNK, max_chunk_per_gpu=8, max_num_batched_tokens=48, max_waiting=4))


def prompt(n: int) -> list[int]:
    return [1000 + i for i in range(n)]


def assert_still_serving(engine: LLMEngine) -> None:
    [done] = generate(engine, [prompt(5)], SamplingParams(max_tokens=3, ignore_eos=True))
    assert len(done.token_ids) == 3 and done.finish_reason is FinishReason.LENGTH
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def refused(engine: LLMEngine, request: EngineRequest) -> EngineError:
    with pytest.raises(EngineError) as info:
        engine.add_request(request)
    return info.value


def test_misaligned_padding_is_chunk_size_mismatch(engine):
    request = make_request(engine, prompt(10), SamplingParams())
    request.prompt_token_ids = request.prompt_token_ids[:-1]
    error = refused(engine, request)
    assert error.code is ErrorCode.CHUNK_SIZE_MISMATCH and f"multiple of chunk_size {CHUNK}" in error.message
    assert_still_serving(engine)


def test_request_padded_for_another_pool_is_chunk_size_mismatch(engine):
    # 64 is a multiple of this engine's 32, but the request says it was padded for 64
    request = EngineRequest("other-pool", prompt(50) + [0] * 14, SamplingParams(), chunk_size=64, pad_length=14)
    error = refused(engine, request)
    assert error.code is ErrorCode.CHUNK_SIZE_MISMATCH and "padded for chunk_size 64" in error.message
    assert_still_serving(engine)


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (lambda r: setattr(r, "pad_length", len(r.prompt_token_ids)), "leaves no prompt"),
        (lambda r: setattr(r, "request_id", ""), "request_id"),
        (lambda r: r.prompt_token_ids.__setitem__(0, 10**9), "outside the vocabulary"),
    ],
)
def test_malformed_requests_are_invalid_argument(engine, mutate, fragment):
    request = make_request(engine, prompt(10), SamplingParams())
    mutate(request)
    error = refused(engine, request)
    assert error.code is ErrorCode.INVALID_ARGUMENT and fragment in error.message
    assert_still_serving(engine)


@pytest.mark.parametrize(
    "params, fragment",
    [
        (SamplingParams(max_tokens=0), "max_tokens"),
        (SamplingParams(temperature=-1.0), "temperature"),
        (SamplingParams(temperature=float("nan")), "temperature"),
        (SamplingParams(top_p=0.0), "top_p"),
        (SamplingParams(top_k=-2), "top_k"),
        (SamplingParams(seed=-1), "seed"),
        (SamplingParams(stop_token_ids=(10**9,)), "stop_token_ids"),
        (SamplingParams(stop=("",)), "stop strings"),
        (SamplingParams(logprobs=1000), "logprobs"),
    ],
)
def test_invalid_sampling_parameters_are_invalid_argument(engine, params, fragment):
    error = refused(engine, make_request(engine, prompt(4), params))
    assert error.code is ErrorCode.INVALID_ARGUMENT and fragment in error.message


def test_request_beyond_the_engine_context_is_refused_at_once(engine):
    capacity = engine.capacity_tokens
    error = refused(engine, make_request(engine, prompt(capacity - 10), SamplingParams(max_tokens=20)))
    assert error.code is ErrorCode.INVALID_ARGUMENT and f"context of {capacity} tokens" in error.message
    assert_still_serving(engine)


def test_duplicate_request_id_is_refused(engine):
    engine.add_request(make_request(engine, prompt(4), SamplingParams(max_tokens=2), request_id="dup"))
    error = refused(engine, make_request(engine, prompt(4), SamplingParams(), request_id="dup"))
    assert error.code is ErrorCode.INVALID_ARGUMENT
    engine.abort("dup")
    assert_still_serving(engine)


def test_expired_deadline_is_refused_and_a_running_one_expires(engine):
    request = make_request(engine, prompt(4), SamplingParams())
    request.deadline = time.time() - 1
    assert refused(engine, request).code is ErrorCode.DEADLINE_EXCEEDED
    request = make_request(engine, prompt(4), SamplingParams(max_tokens=50, ignore_eos=True))
    request.deadline = time.time() + 3600
    engine.add_request(request)
    engine.step()
    engine._sequences[request.request_id].deadline = time.time() - 1  # time passes
    [out] = [o for o in engine.step().outputs if o.request_id == request.request_id]
    assert out.finish_reason is FinishReason.ERROR and out.error.code is ErrorCode.DEADLINE_EXCEEDED
    assert_still_serving(engine)


def test_abort_mid_prefill_frees_blocks_in_that_step(engine):
    request = make_request(engine, prompt(150), SamplingParams(max_tokens=5))  # 150 > budget 48: several prefill slices
    engine.add_request(request)
    engine.step()
    seq = engine._sequences[request.request_id]
    assert 0 < seq.num_computed_tokens < 150 and engine.block_manager.num_free_blocks < engine.block_manager.num_blocks
    out = engine.abort(request.request_id)
    assert out.finish_reason is FinishReason.ABORT and out.usage.prompt_tokens == 150
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert engine.abort(request.request_id) is None  # already gone
    assert_still_serving(engine)


def test_abort_mid_decode_frees_blocks_and_spares_the_others(engine):
    keep = make_request(engine, prompt(20), SamplingParams(max_tokens=6, ignore_eos=True))
    drop = make_request(engine, prompt(30), SamplingParams(max_tokens=100, ignore_eos=True))
    engine.add_request(keep)
    engine.add_request(drop)
    completions = {r.request_id: Completion(r.request_id) for r in (keep, drop)}
    while len(completions[drop.request_id].token_ids) < 2:
        collect(completions, engine.step().outputs)
    aborted = engine.abort(drop.request_id)
    assert aborted.finish_reason is FinishReason.ABORT and aborted.usage.completion_tokens >= 2
    while completions[keep.request_id].finish_reason is None:
        collect(completions, engine.step().outputs)
    assert len(completions[keep.request_id].token_ids) == 6
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_kv_above_admission_limit_is_resource_exhausted(tiny_model):
    engine = LLMEngine(tiny_model, EngineConfig(chunk_size=CHUNK, max_chunk_per_gpu=4, max_num_batched_tokens=256))
    big = make_request(engine, prompt(120), SamplingParams(max_tokens=8, ignore_eos=True))  # 128 tokens = all 4 chunks
    engine.add_request(big)
    completions = {big.request_id: Completion(big.request_id)}
    collect(completions, engine.step().outputs)
    assert engine.kv_usage > 0.92
    error = refused(engine, make_request(engine, prompt(4), SamplingParams()))
    assert error.code is ErrorCode.RESOURCE_EXHAUSTED and "KV cache" in error.message
    while completions[big.request_id].finish_reason is None:
        collect(completions, engine.step().outputs)
    assert len(completions[big.request_id].token_ids) == 8  # the running one finished, nothing dropped
    assert_still_serving(engine)


def test_full_queue_is_resource_exhausted(tiny_model):
    engine = LLMEngine(tiny_model, EngineConfig(chunk_size=CHUNK, max_chunk_per_gpu=4, max_waiting=2))
    for _ in range(2):
        engine.add_request(make_request(engine, prompt(4), SamplingParams(max_tokens=2)))
    error = refused(engine, make_request(engine, prompt(4), SamplingParams()))
    assert error.code is ErrorCode.RESOURCE_EXHAUSTED and "queue full" in error.message


def test_preempted_requests_are_recomputed_not_dropped(tiny_model):
    # 4 chunks of 32 = 128 tokens; four requests that each grow to 70 tokens cannot all stay resident
    engine = LLMEngine(tiny_model, EngineConfig(chunk_size=CHUNK, max_chunk_per_gpu=4, max_num_batched_tokens=256))
    together = generate(engine, [prompt(40 + i) for i in range(4)], SamplingParams(max_tokens=30, ignore_eos=True))
    assert engine.num_preemptions > 0 and sum(c.last.timings.preemptions for c in together) > 0
    assert all(len(c.token_ids) == 30 and c.finish_reason is FinishReason.LENGTH for c in together)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    # token-for-token equality under preemption is checked on SmolLM2 in test_parity.py


def test_kv_that_does_not_fit_the_budget_names_the_largest_that_fits(tiny_model):
    with pytest.raises(EngineConfigError) as info:
        LLMEngine(tiny_model, EngineConfig(chunk_size=256, max_chunk_per_gpu=10**6, cpu_memory_budget_gib=0.5))
    assert "max_chunk_per_gpu=1000000 does not fit" in str(info.value)
    largest = int(str(info.value).rsplit(" ", 1)[1])
    assert largest > 0
    LLMEngine(tiny_model, EngineConfig(chunk_size=256, max_chunk_per_gpu=largest, cpu_memory_budget_gib=0.5))
    with pytest.raises(EngineConfigError):
        LLMEngine(tiny_model, EngineConfig(chunk_size=256, max_chunk_per_gpu=largest + 1, cpu_memory_budget_gib=0.5))


def test_unknown_node_type_and_bad_block_geometry_are_refused(tiny_model):
    with pytest.raises(EngineConfigError, match="unknown node type"):
        LLMEngine(tiny_model, EngineConfig(chunk_size=32, node_type="tpu-v9"))
    with pytest.raises(EngineConfigError, match="multiple of block_size"):
        LLMEngine(tiny_model, EngineConfig(chunk_size=40, block_size=16, max_chunk_per_gpu=2))


def test_node_type_defaults(tiny_model):
    assert LLMEngine(tiny_model, EngineConfig(chunk_size=32, node_type="a100-40g", cpu_memory_budget_gib=1)).max_chunk_per_gpu == 2
    assert LLMEngine(tiny_model, EngineConfig(chunk_size=32, node_type="h100-80g", cpu_memory_budget_gib=1)).max_chunk_per_gpu == 8


def test_a_failing_step_fails_its_requests_with_internal_and_the_engine_recovers(engine, monkeypatch):
    request = make_request(engine, prompt(12), SamplingParams(max_tokens=4))
    engine.add_request(request)

    def broken_forward(batch, kv):
        raise RuntimeError("simulated device fault")

    monkeypatch.setattr(engine.runner.model, "forward", broken_forward)
    [out] = engine.step().outputs
    assert out.request_id == request.request_id and out.finish_reason is FinishReason.ERROR
    assert out.error.code is ErrorCode.INTERNAL and "simulated device fault" in out.error.message
    monkeypatch.undo()
    assert_still_serving(engine)


@pytest.mark.parametrize(
    "num_waiting, kv_usage, said",
    [(4, 0.0, "queue full (4 waiting)"), (0, 0.93, "KV cache 93% full (limit 92%)")],
)
def test_no_room_is_resource_exhausted_without_an_engine(num_waiting, kv_usage, said):
    check_room(0, max_waiting=4, kv_usage=0.92, kv_admission_limit=0.92)  # at the limits: room
    with pytest.raises(EngineError) as info:
        check_room(num_waiting, max_waiting=4, kv_usage=kv_usage, kv_admission_limit=0.92)
    assert info.value.code is ErrorCode.RESOURCE_EXHAUSTED and said in info.value.message


def test_a_step_records_what_it_computed_and_one_that_computed_nothing_records_nothing(engine):
    request = make_request(engine, prompt(5), SamplingParams(max_tokens=2, ignore_eos=True))
    engine_request_id = request.request_id
    engine.add_request(request)
    result = engine.step()
    assert result.forward_failed is False
    assert [(rid, n, prefill) for rid, n, prefill in result.record.items] == [(engine_request_id, 5, True)]
    while engine.has_unfinished():
        engine.step()
    idle = engine.step()  # nothing left to run
    assert idle.record is None and idle.forward_failed is None and idle.outputs == []
