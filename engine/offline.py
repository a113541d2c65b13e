"""Running the engine in-process, without a server: the CLI, benchmarks and tests use this."""

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from common.padding import pad_to_chunk_size
from engine.core.request import EngineRequest, RequestOutput
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import FinishReason
from engine.llm_engine import LLMEngine

_ids = itertools.count()


@dataclass
class Completion:
    request_id: str
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list = field(default_factory=list)
    finish_reason: FinishReason | None = None
    last: RequestOutput | None = None  # the final output: usage, timings, error


def make_request(engine: LLMEngine, prompt_token_ids: list[int], sampling: SamplingParams, request_id: str | None = None) -> EngineRequest:
    """A request padded to the engine's chunk_size, as the gateway sends it."""
    padded, pad_length = pad_to_chunk_size(prompt_token_ids, engine.config.chunk_size, engine.tokenizer.pad_token_id)
    return EngineRequest(
        request_id=request_id or f"offline-{next(_ids)}",
        prompt_token_ids=padded,
        sampling=sampling,
        chunk_size=engine.config.chunk_size,
        pad_length=pad_length,
    )


def collect(completions: dict[str, Completion], outputs: list[RequestOutput]) -> None:
    for out in outputs:
        c = completions[out.request_id]
        c.token_ids += out.token_ids
        c.text += out.text
        c.logprobs += out.logprobs
        if out.finished:
            c.finish_reason, c.last = out.finish_reason, out


def generate(
    engine: LLMEngine,
    prompts: list[list[int]],
    sampling: SamplingParams | list[SamplingParams],
    on_finish: Callable[[Completion], None] | None = None,
) -> list[Completion]:
    """Submit all prompts at once and run the engine until every one has finished."""
    params = sampling if isinstance(sampling, list) else [sampling] * len(prompts)
    requests = [make_request(engine, p, s) for p, s in zip(prompts, params)]
    completions = {r.request_id: Completion(r.request_id) for r in requests}
    for request in requests:
        engine.add_request(request)
    unfinished = len(requests)
    while unfinished:
        outputs = engine.step().outputs
        collect(completions, outputs)
        for out in outputs:
            if out.finished:
                unfinished -= 1
                if on_finish is not None:
                    on_finish(completions[out.request_id])
    return [completions[r.request_id] for r in requests]


def stream(engine: LLMEngine, prompt_token_ids: list[int], sampling: SamplingParams) -> Iterator[RequestOutput]:
    """Yield one request's outputs step by step, the last one carrying the finish reason."""
    request = make_request(engine, prompt_token_ids, sampling)
    engine.add_request(request)
    while True:
        for out in engine.step().outputs:
            if out.request_id == request.request_id:
                yield out
                if out.finished:
                    return
