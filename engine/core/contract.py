"""The engine-core contract: everything the ZMQ server, heartbeat, health, metrics and tracing
use of an engine (engine/serve/). K25's engine implements it (engine/llm_engine.py: this core
over a model runner); a second backend implements the same methods and plugs in under the
same server.

The calls come from one thread, the one that steps the engine, except `read_adapter`, which
any thread may call."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from common.tokenizer import Tokenizer
from engine.base.config import EngineConfig
from engine.base.errors import EngineError
from engine.core.lower_tiers import DEVICE, DISK, HOST
from engine.core.request import EngineRequest, RequestOutput
from engine.lora.adapter import LoadedAdapter


@dataclass(frozen=True)
class StepRecord:
    """What one engine step computed: for each request, how many tokens and whether they
    were part of its prompt (a prefill slice) or a decode."""

    start_ns: int
    end_ns: int
    items: tuple[tuple[str, int, bool], ...]  # (request_id, tokens, prefill)


@dataclass(frozen=True)
class EngineLoad:
    """The engine's load and its prefix cache's counters since start."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0  # fraction of KV blocks in use (cached blocks no request uses are free)
    preemptions: int = 0
    adapters: tuple[str, ...] = ()  # name@version of the adapters it serves
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0
    prefix_evicted_blocks: int = 0
    # KV tiers below the device (engine/core/lower_tiers.py); empty when there are none
    kv_tier_hit_tokens: tuple[tuple[str, int], ...] = ()  # (tier, prompt tokens brought back from it)
    kv_tier_blocks: tuple[tuple[str, int, int], ...] = ()  # (tier, blocks, bytes) held now
    kv_tier_copied_bytes: tuple[tuple[str, int], ...] = ()  # (direction, bytes) copied between tiers
    kv_tier_copy_seconds: float = 0.0
    kv_tier_dropped_blocks: int = 0  # stored blocks found unreadable (checksum, truncation, I/O): recomputed


@dataclass(frozen=True)
class StepResult:
    """What a step gives back: each request's new output (a delta or its end), what it computed
    (None: no model step ran), whether the model step failed (None: none ran), and the
    prefix-cache changes since the last step while KV events are on: for each block hash that
    changed, the highest tier that holds it now (KV_TIERS), None when no tier does."""

    outputs: list[RequestOutput]
    record: StepRecord | None = None
    forward_failed: bool | None = None
    kv_events: Mapping[int, str | None] = field(default_factory=dict)


KV_TIERS = (DEVICE, HOST, DISK)  # highest first; a backend without lower tiers names only DEVICE


class EngineBackend(Protocol):
    config: EngineConfig  # chunk_size, limits and the rest the server and heartbeat report
    tokenizer: Tokenizer
    max_chunk_per_gpu: int  # KV chunks of chunk_size tokens this device holds
    capacity_tokens: int
    max_model_len: int

    def add_request(self, request: EngineRequest) -> None:
        """Queue a request, or raise EngineError saying why it will not run."""

    def abort(self, request_id: str, error: EngineError | None = None) -> RequestOutput | None:
        """End a request now and free its KV: ABORT, or `error` when given; None if unknown."""

    def step(self) -> StepResult: ...

    def has_unfinished(self) -> bool: ...

    def load(self) -> EngineLoad: ...

    def set_kv_events(self, enabled: bool) -> None:
        """Collect prefix-cache changes for StepResult.kv_events (off: drop what was collected).
        Turned on, the first step's changes include every block a tier below the device already
        holds (a restarted engine's disk)."""

    def drain(self) -> list[str]:
        """Stop announcing prefix-cache changes; the ids of requests that have not started (the
        caller hands them back, since nothing was computed for them)."""

    def read_adapter(self, name: str, version: str, path: str, checksum: str | None = None) -> object:
        """The slow part of an adapter load, safe on any thread; `install_adapter` finishes it."""

    def install_adapter(self, read: object) -> LoadedAdapter: ...

    def load_adapter(self, name: str, version: str, path: str, checksum: str | None = None) -> LoadedAdapter: ...

    def unload_adapter(self, name: str, version: str) -> bool: ...

    @property
    def adapter_keys(self) -> list[str]: ...

    def close(self) -> None:
        """Release what outlives a request: the KV tiers' copies under way and their worker
        thread, after writing the device's cached blocks to the disk tier if there is one. The
        last call; the server makes it once it has ended every request."""
