"""What the engine core needs of whatever runs the model: K25's model runner
(engine/runner/model_runner.py) on one device. The core schedules; the executor owns the
device: weights, the KV cache tensors, adapter slots and each request's random generator."""

from typing import TYPE_CHECKING, Protocol

from engine.core.sampling_params import SampledToken
from engine.core.scheduler import ScheduledBatch
from engine.core.sequence import Sequence

if TYPE_CHECKING:  # the adapter manager holds device tensors; the core only calls it
    from engine.core.lower_tiers import LowerTiers
    from engine.lora.manager import AdapterManager


class ModelExecutor(Protocol):
    num_kv_blocks: int  # KV blocks of block_size tokens the device holds for requests
    max_chunk_per_gpu: int
    capacity_tokens: int
    max_model_len: int
    vocab_size: int  # the model's (token ids at or above it are refused)
    adapters: "AdapterManager"
    lower_tiers: "LowerTiers | None"  # KV tiers below the device (engine/kv_tiers/); None: the device's only

    def add(self, seq: Sequence) -> None:
        """A request joins: set up what the device keeps for it (its sampling generator)."""

    def forget_blocks(self, request_id: str) -> None:
        """A preempted request's block-table row goes; it is rebuilt when the request runs again."""

    def finish(self, request_id: str) -> None:
        """A request ended: drop everything the device kept for it."""

    def execute(self, batch: ScheduledBatch) -> list[tuple[Sequence, SampledToken]]:
        """Run one forward pass over the batch and sample a token for each sequence whose
        scheduled tokens reach its end. Raises on failure; the core fails the batch's requests."""
