"""What goes into the engine and what comes out of it, per request: the server, the wire
conversions and the offline runner speak these types."""

from dataclasses import dataclass, field

from engine.base.errors import EngineError
from engine.core.sampling_params import SampledToken, SamplingParams
from engine.core.sequence import FinishReason
from engine.lora.adapter import AdapterRef


@dataclass
class EngineRequest:
    request_id: str
    prompt_token_ids: list[int]  # padded: a multiple of chunk_size, pads at the end
    sampling: SamplingParams
    chunk_size: int  # the chunk_size the caller padded for
    pad_length: int = 0
    deadline: float | None = None  # time.time() seconds
    adapter: AdapterRef | None = None  # None: the base model
    cache_salt: str = ""  # requests share cached prefix blocks only with requests of the same salt


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    pad_tokens: int
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache, in any tier
    host_cached_tokens: int = 0  # ... of which were brought back from host memory
    disk_cached_tokens: int = 0  # ... and from local disk


@dataclass
class Timings:
    queued_s: float
    time_to_first_token_s: float
    total_s: float
    prefill_slices: int  # engine steps that computed part of the prompt
    preemptions: int


@dataclass
class RequestOutput:
    """What one step produced for one request: a delta, and on the last one the outcome."""

    request_id: str
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[SampledToken] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    error: EngineError | None = None
    usage: Usage | None = None
    timings: Timings | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
