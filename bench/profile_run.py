"""`k25 bench profile`: the memory the engine's start-time check counts on this device, then
the real engine (in process) run on one workload at each candidate `max_chunk_per_gpu`, and the
value engine/hardware/chunk_choice.py recommends from the measured curve."""

import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch

from bench.profile_workload import ProfileRequest
from bench.serve_stats import percentile
from engine.base.config import EngineConfig
from engine.base.errors import EngineError, ErrorCode
from engine.core.sampling_params import SamplingParams
from engine.hardware.chunk_choice import ChunkChoice, CurvePoint, recommend
from engine.llm_engine import LLMEngine
from engine.model.loader import LoadedModel
from engine.offline import make_request
from engine.runner.memory_budget import MemoryPlan, memory_plan


@dataclass(frozen=True)
class Measured:
    max_chunk_per_gpu: int
    seconds: float  # first arrival to last finish
    tokens_per_s: float  # generated tokens
    p50_latency_s: float  # arrival to finish
    p95_latency_s: float
    preemptions: int  # requests whose KV was taken back to make room, then recomputed

    def point(self) -> CurvePoint:
        return CurvePoint(self.max_chunk_per_gpu, self.tokens_per_s, self.p95_latency_s)


@dataclass
class ProfileResult:
    device: str
    dtype: str
    chunk_size: int
    plan: MemoryPlan
    largest: int
    measured: list[Measured]
    recommended: ChunkChoice
    rounds: int

    def as_dict(self) -> dict:
        return {**asdict(self), "plan": {**asdict(self.plan), "largest_max_chunk_per_gpu": self.largest}}


def engine_memory(model: LoadedModel, config: EngineConfig) -> MemoryPlan:
    """What the engine counts at start, read off an engine built with one chunk of KV."""
    engine = LLMEngine(model, replace(config, max_chunk_per_gpu=1))
    return memory_plan(config, model.config, engine.runner.device, getattr(torch, config.dtype), engine.runner.model.weight_bytes)


def run_once(model: LoadedModel, config: EngineConfig, requests: list[ProfileRequest],
             tick: Callable[[], None] = lambda: None) -> Measured:
    """Run every request through a fresh engine, each submitted at its arrival (and again on
    each step while the engine answers RESOURCE_EXHAUSTED, as a gateway would retry it)."""
    engine = LLMEngine(model, config)
    pending = deque(sorted(requests, key=lambda r: r.arrival_s))
    waiting: deque = deque()  # (request, its arrival) arrived, not yet taken
    arrival, finish, generated = {}, {}, 0
    start = time.perf_counter()
    while len(finish) < len(requests):
        now = time.perf_counter() - start
        while pending and pending[0].arrival_s <= now:
            r = pending.popleft()
            waiting.append(make_request(engine, r.prompt, SamplingParams(max_tokens=r.max_tokens, ignore_eos=True)))
            arrival[waiting[-1].request_id] = r.arrival_s
        while waiting:
            try:
                engine.add_request(waiting[0])
            except EngineError as exc:
                if exc.code != ErrorCode.RESOURCE_EXHAUSTED:
                    raise
                break
            waiting.popleft()
        if engine.has_unfinished():
            for out in engine.step().outputs:
                generated += len(out.token_ids)
                if out.finished:
                    finish[out.request_id] = time.perf_counter() - start
                    tick()
        elif pending:
            time.sleep(max(0.0, pending[0].arrival_s - (time.perf_counter() - start)))
        elif waiting:
            raise RuntimeError("the engine is idle and still refuses a request")
    latencies = [finish[i] - arrival[i] for i in finish]
    seconds = max(finish.values()) - min(arrival.values())
    return Measured(config.max_chunk_per_gpu, seconds, generated / seconds, percentile(latencies, 50),
                    percentile(latencies, 95), engine.num_preemptions)


def profile(model: LoadedModel, config: EngineConfig, requests: list[ProfileRequest], candidates: tuple[int, ...],
            plan: MemoryPlan, throughput_tolerance: float, latency_tolerance: float, rounds: int = 1,
            tick: Callable[[], None] = lambda: None) -> ProfileResult:
    """After a short warm-up run (not counted), each candidate once a round, in turn (so that a
    slow spell of a shared machine falls on all of them); a candidate's run with the highest
    throughput counts. Then the recommendation."""
    run_once(model, replace(config, max_chunk_per_gpu=candidates[-1]), [replace(r, arrival_s=0.0) for r in requests[:2]])
    best: dict[int, Measured] = {}
    for _ in range(rounds):
        for value in candidates:
            m = run_once(model, replace(config, max_chunk_per_gpu=value), requests, tick)
            if value not in best or m.tokens_per_s > best[value].tokens_per_s:
                best[value] = m
    measured = [best[value] for value in candidates]
    largest = plan.largest_max_chunk_per_gpu
    chosen = recommend([m.point() for m in measured], largest, throughput_tolerance, latency_tolerance)
    return ProfileResult(config.device, config.dtype, config.chunk_size, plan, largest, measured, chosen, rounds)
