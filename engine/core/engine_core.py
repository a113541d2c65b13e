"""The engine core: admit requests, schedule a step, have the executor run it, update each
request with what was computed, and emit each sampled token through the output processor,
which turns it into the request's delta."""

import logging
import time
from typing import TYPE_CHECKING

from common.tokenizer import Tokenizer
from engine.base.config import EngineConfig
from engine.base.errors import EngineConfigError, EngineError, ErrorCode
from engine.core.admission import check_room, validate
from engine.core.block_manager import BlockManager
from engine.core.contract import EngineLoad, StepRecord, StepResult
from engine.core.executor import ModelExecutor
from engine.core.lower_tiers import DEVICE
from engine.core.output_processor import OutputProcessor
from engine.core.request import EngineRequest, RequestOutput
from engine.core.sampling_params import SampledToken
from engine.core.scheduler import ScheduledBatch, Scheduler
from engine.core.sequence import FinishReason, Sequence
from engine.lora.adapter import AdapterRef, LoadedAdapter

if TYPE_CHECKING:
    from engine.lora.manager import ReadAdapter

log = logging.getLogger(__name__)


class EngineCore:
    """Implements the engine-core contract (engine/core/contract.py) over a model executor."""

    def __init__(self, config: EngineConfig, executor: ModelExecutor, tokenizer: Tokenizer):
        if config.chunk_size % config.block_size:
            raise EngineConfigError(f"chunk_size {config.chunk_size} must be a multiple of block_size {config.block_size}")
        self.config = config
        self.tokenizer = tokenizer
        self.executor = executor
        self.max_chunk_per_gpu = executor.max_chunk_per_gpu
        self.capacity_tokens = executor.capacity_tokens
        self.max_model_len = executor.max_model_len
        self.block_manager = BlockManager(executor.num_kv_blocks, config.block_size, config.prefix_caching)
        self.lower_tiers = getattr(executor, "lower_tiers", None)  # KV tiers below the device, if any
        self.scheduler = Scheduler(
            self.block_manager, config.max_num_batched_tokens, config.max_num_seqs, config.max_loras, config.overtake_limit_s,
            self.lower_tiers,
        )
        self.output_processor = OutputProcessor(tokenizer)
        self._sequences: dict[str, Sequence] = {}
        self.num_preemptions = 0

    # --- load -------------------------------------------------------------------------

    @property
    def kv_usage(self) -> float:
        return self.block_manager.usage

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished > 0

    def load(self) -> EngineLoad:
        cache = self.block_manager.stats
        return EngineLoad(
            running=self.num_running, waiting=self.num_waiting, kv_usage=self.kv_usage, preemptions=self.num_preemptions,
            adapters=tuple(self.adapter_keys), prefix_queried_tokens=cache.queried_tokens,
            prefix_hit_tokens=cache.hit_tokens, prefix_evicted_blocks=cache.evicted_blocks, **self._tier_load(),
        )

    def _tier_load(self) -> dict:
        tiers = self.lower_tiers
        if tiers is None:
            return {}
        s = tiers.stats
        return dict(
            kv_tier_hit_tokens=(("host", s.host_hit_tokens - s.disk_hit_tokens), ("disk", s.disk_hit_tokens)),
            kv_tier_blocks=tuple((tier, blocks, nbytes) for tier, (blocks, nbytes) in tiers.tier_blocks().items()),
            kv_tier_copied_bytes=(("to_host", s.bytes_to_host), ("to_device", s.bytes_to_device),
                                  ("to_disk", s.bytes_to_disk), ("from_disk", s.bytes_from_disk)),
            kv_tier_copy_seconds=s.copy_seconds, kv_tier_dropped_blocks=s.dropped_blocks,
        )

    def set_kv_events(self, enabled: bool) -> None:
        self.block_manager.events_enabled = enabled
        if self.lower_tiers is not None:
            self.lower_tiers.watch(enabled)
        if not enabled:
            self.block_manager.take_events()

    def close(self) -> None:
        if self.lower_tiers is not None:
            self.lower_tiers.close(self.block_manager.cached_blocks())

    def drain(self) -> list[str]:
        self.set_kv_events(False)
        return [seq.request_id for seq in self.scheduler.waiting if seq.first_scheduled_time is None]

    # --- requests ---------------------------------------------------------------------

    def add_request(self, request: EngineRequest) -> None:
        adapter = self.executor.adapters.get(request.adapter) if request.adapter is not None else None
        prompt = validate(
            request, self._sequences, self.config.chunk_size, self.executor.vocab_size, self.max_model_len, time.time()
        )
        check_room(self.num_waiting, self.config.max_waiting, self.kv_usage, self.config.kv_admission_limit)
        seq = Sequence(
            request_id=request.request_id,
            prompt_token_ids=prompt,
            sampling=request.sampling,
            pad_length=request.pad_length,
            deadline=request.deadline,
            adapter=adapter,
            cache_salt=request.cache_salt,
        )
        self._sequences[seq.request_id] = seq
        self.executor.add(seq)
        self.output_processor.add(seq.request_id)
        self.scheduler.add(seq)

    def abort(self, request_id: str, error: EngineError | None = None) -> RequestOutput | None:
        seq = self._sequences.get(request_id)
        if seq is None:
            return None
        return self._finish(seq, FinishReason.ABORT if error is None else FinishReason.ERROR, error)

    # --- adapters ---------------------------------------------------------------------

    def load_adapter(self, name: str, version: str, path: str, checksum: str | None = None) -> LoadedAdapter:
        """Make `name@version` servable from `path` under the adapter root; call it between steps.
        Raises EngineError (INVALID_ARGUMENT, ADAPTER_NOT_FOUND)."""
        return self.executor.adapters.load(AdapterRef(name, version), path, checksum)

    def read_adapter(self, name: str, version: str, path: str, checksum: str | None = None) -> "ReadAdapter":
        return self.executor.adapters.read(AdapterRef(name, version), path, checksum)

    def install_adapter(self, read: "ReadAdapter") -> LoadedAdapter:
        return self.executor.adapters.register(read)

    def unload_adapter(self, name: str, version: str) -> bool:
        """Refuse new requests for `name@version`; those admitted already finish on it."""
        return self.executor.adapters.unload(AdapterRef(name, version))

    @property
    def adapter_keys(self) -> list[str]:
        return self.executor.adapters.keys

    # --- the loop ---------------------------------------------------------------------

    def step(self) -> StepResult:
        outputs = self._expire_deadlines()
        if self.lower_tiers is not None:
            self.lower_tiers.poll()
        batch = self._schedule(outputs)
        if not batch.items:
            if self.lower_tiers is not None and self.lower_tiers.reading:
                self.lower_tiers.poll(timeout=0.05)  # only requests waiting for disk blocks: wait for a read, not spin
            return StepResult(outputs, kv_events=self._kv_events())
        started_ns = time.time_ns()
        try:
            sampled = self.executor.execute(batch)
        except Exception as exc:  # a failed step fails its requests, never the engine
            log.exception("engine step failed; failing its %d requests", len(batch.items))
            error = EngineError(ErrorCode.INTERNAL, f"engine step failed: {exc}")
            outputs += [self._finish(seq, FinishReason.ERROR, error) for seq, _ in batch.items]
            return StepResult(outputs, forward_failed=True, kv_events=self._kv_events())
        record = self._update(batch, started_ns)
        outputs += self._emit(sampled)
        return StepResult(outputs, record, forward_failed=False, kv_events=self._kv_events())

    def _schedule(self, outputs: list[RequestOutput]) -> ScheduledBatch:
        batch = self.scheduler.schedule()
        self.num_preemptions += len(batch.preempted)
        for seq in batch.preempted:
            self.executor.forget_blocks(seq.request_id)
        outputs += self._assign_adapter_slots(batch)
        now = time.monotonic()
        for seq, _ in batch.items:
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = now
        return batch

    def _assign_adapter_slots(self, batch: ScheduledBatch) -> list[RequestOutput]:
        """Put the adapter of each sequence admitted this step in its device slot; the scheduler
        admitted no more adapters than there are slots. Fails those whose adapter cannot be read again."""
        failed = []
        for seq in batch.admitted:
            if seq.adapter is None:
                continue
            try:
                seq.lora_slot = self.executor.adapters.slot_for(seq.adapter)
            except EngineError as error:
                failed.append(self._finish(seq, FinishReason.ERROR, error))
        if failed:
            batch.items = [(seq, n) for seq, n in batch.items if not seq.is_finished]
        return failed

    def _update(self, batch: ScheduledBatch, started_ns: int) -> StepRecord:
        """Count what the step computed: its tokens are in the KV cache now."""
        items = []
        for seq, n in batch.items:
            prefill = seq.num_computed_tokens < len(seq.prompt_token_ids)
            seq.prefill_slices += prefill
            self.scheduler.mark_computed(seq, n)
            items.append((seq.request_id, n, prefill))
        return StepRecord(started_ns, time.time_ns(), tuple(items))

    def _emit(self, sampled: list[tuple[Sequence, SampledToken]]) -> list[RequestOutput]:
        outputs = []
        token_time = time.monotonic()
        for seq, token in sampled:
            if token.error is not None:
                outputs.append(self._finish(seq, FinishReason.ERROR, token.error))
                continue
            if seq.first_token_time is None:
                seq.first_token_time = token_time
            seq.output_token_ids.append(token.token_id)
            output = self.output_processor.append(seq, token)
            if output.finished:
                self._release(seq, output.finish_reason)
            outputs.append(output)
        return outputs

    def _kv_events(self) -> dict[int, str | None]:
        """Each block hash that entered or left a tier, with the highest tier that holds it now."""
        if not self.block_manager.events_enabled:
            return {}
        stored, removed = self.block_manager.take_events()
        changed = [*removed, *stored, *(self.lower_tiers.take_changed() if self.lower_tiers is not None else ())]
        return {h: self._tier_of(h) for h in changed}

    def _tier_of(self, h: int) -> str | None:
        if self.block_manager.holds(h):
            return DEVICE
        return self.lower_tiers.tier_of(h) if self.lower_tiers is not None else None

    def _expire_deadlines(self) -> list[RequestOutput]:
        now = time.time()
        expired = [s for s in self._sequences.values() if s.deadline is not None and s.deadline <= now]
        error = EngineError(ErrorCode.DEADLINE_EXCEEDED, "deadline passed before the request finished")
        return [self._finish(seq, FinishReason.ERROR, error) for seq in expired]

    def _finish(self, seq: Sequence, reason: FinishReason, error: EngineError | None = None) -> RequestOutput:
        """End a request the output processor did not end (aborted, expired or failed)."""
        self._release(seq, reason)
        return self.output_processor.finish(seq, reason, error)

    def _release(self, seq: Sequence, reason: FinishReason) -> None:
        self.scheduler.finish(seq)
        self.executor.finish(seq.request_id)
        seq.finish_reason = reason
        del self._sequences[seq.request_id]
