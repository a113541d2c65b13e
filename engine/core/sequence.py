"""One request's state inside the engine."""

import enum
import itertools
import time
from dataclasses import dataclass, field

from common.prefix_hash import cache_seed, chain_block_hashes
from engine.core.sampling_params import SamplingParams
from engine.lora.adapter import BASE_SLOT, LoadedAdapter


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


_arrival_counter = itertools.count()


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_token_ids: list[int]  # real prompt, pads already stripped
    sampling: SamplingParams
    pad_length: int = 0
    deadline: float | None = None  # time.time() seconds; None = none
    adapter: LoadedAdapter | None = None  # None: the base model
    lora_slot: int = BASE_SLOT  # the device slot holding its adapter, set each time it is admitted to the running batch
    output_token_ids: list[int] = field(default_factory=list)
    # tokens whose KV is in the cache; prompt and output tokens alike
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    # FCFS priority: lower arrived earlier; kept across preemptions
    arrival_order: int = field(default_factory=lambda: next(_arrival_counter))
    arrival_time: float = field(default_factory=time.monotonic)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    prefill_slices: int = 0  # steps that computed part of its prompt
    preemptions: int = 0
    cache_salt: str = ""  # shares cached prefix blocks only with sequences of the same salt (and adapter)
    # prefix caching: the hashes of its full blocks so far, how many blocks of its table it
    # has offered to the cache, prompt tokens found cached on its first admission
    block_hashes: list[int] = field(default_factory=list)
    cached_blocks: int = 0
    num_cached_tokens: int = 0
    host_cached_tokens: int = 0  # of num_cached_tokens, those brought back from host memory
    disk_cached_tokens: int = 0  # ... and those read from disk first
    disk_fetched: set[int] = field(default_factory=set)  # block hashes it waited to have read from the disk tier
    tier_held: set[int] = field(default_factory=set)  # ... and those of its prefix kept in host memory meanwhile

    def __post_init__(self):
        # what besides the tokens changes its KV: the hash chain of its blocks starts from it
        self.cache_seed = cache_seed(self.adapter.ref.key if self.adapter else "", self.cache_salt)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_decoding(self) -> bool:
        """All but the newest token are cached: the next step feeds one token."""
        return bool(self.output_token_ids) and self.num_uncomputed_tokens == 1

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def tokens(self, start: int, end: int) -> list[int]:
        """Token ids at positions [start, end): prompt, then output (a recomputed sequence spans both)."""
        prompt_len = len(self.prompt_token_ids)
        if end <= prompt_len:
            return self.prompt_token_ids[start:end]
        return self.prompt_token_ids[start:] + self.output_token_ids[max(0, start - prompt_len) : end - prompt_len]

    def full_block_hashes(self, num_blocks: int, block_size: int) -> list[int]:
        """The prefix hashes of its first `num_blocks` blocks (all full), computed once each."""
        known = len(self.block_hashes)
        if num_blocks > known:
            parent = self.block_hashes[-1] if known else self.cache_seed
            self.block_hashes += chain_block_hashes(self.tokens(known * block_size, num_blocks * block_size), block_size, parent)
        return self.block_hashes[:num_blocks]
