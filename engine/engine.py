"""The engine core: admit requests, schedule a step, run the model, sample, and hand each
sampled token to the output processor, which turns it into the request's delta."""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from common.quant_spec import NO_QUANT, QuantSpecError, parse_quant_spec
from engine.admission import check_room, validate
from engine.base.config import EngineConfig
from engine.base.errors import EngineConfigError, EngineError, ErrorCode
from engine.block_manager import BlockManager
from engine.block_tables import BlockTables
from engine.decode_graphs import DecodeGraphs, StaticDecodeBatch, capture_sizes, graphs_enabled
from engine.forward_batch import host_batch, to_device
from engine.kv_cache import KVCache
from engine.loader import LoadedModel
from engine.lora.adapter import AdapterRef, LoadedAdapter
from engine.lora.manager import AdapterManager, ReadAdapter
from engine.lora.settings import check_lora_settings
from engine.lora.slots import LoRASlots
from engine.memory_budget import fit_max_chunk_per_gpu
from engine.model import LlamaModel
from engine.output_processor import OutputProcessor
from engine.quant.check import check_quant
from engine.request import EngineRequest, RequestOutput
from engine.sampler import make_generator, sample
from engine.scheduler import ScheduledBatch, Scheduler
from engine.sequence import FinishReason, Sequence

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepRecord:
    """What one engine step computed: for each request, how many tokens and whether they
    were part of its prompt (a prefill slice) or a decode."""

    start_ns: int
    end_ns: int
    items: tuple[tuple[str, int, bool], ...]  # (request_id, tokens, prefill)


class LLMEngine:
    def __init__(self, model: LoadedModel, config: EngineConfig = EngineConfig()):
        if config.chunk_size % config.block_size:
            raise EngineConfigError(f"chunk_size {config.chunk_size} must be a multiple of block_size {config.block_size}")
        check_lora_settings(config)
        self.config = config
        self.tokenizer = model.tokenizer
        self.model_config = model.config
        self.device = torch.device(config.device)
        dtype = getattr(torch, config.dtype)
        lora_slots = (
            LoRASlots(model.config, config.max_loras, config.max_lora_rank, self.device, dtype, config.lora_kernel)
            if config.max_loras
            else None
        )
        try:
            quant = parse_quant_spec(config.quant) if config.quant else NO_QUANT
        except QuantSpecError as exc:
            raise EngineConfigError(f"--quant: {exc}") from None
        check_quant(quant, model.config, config.device, config.dtype)
        self.model = LlamaModel(model.config, model.weights, self.device, dtype, lora_slots, quant)
        weight_bytes = self.model.weight_bytes + (lora_slots.nbytes if lora_slots else 0)
        self.max_chunk_per_gpu = fit_max_chunk_per_gpu(config, model.config, self.device, dtype, weight_bytes)
        self.capacity_tokens = self.max_chunk_per_gpu * config.chunk_size
        self.max_model_len = min(self.capacity_tokens, model.config.max_position_embeddings)
        self.block_manager = BlockManager(self.capacity_tokens // config.block_size, config.block_size, config.prefix_caching)
        graphs = graphs_enabled(config, self.device)
        # with graphs, one block more than the manager hands out: the decode graphs' padding writes there
        self.kv = KVCache(model.config, self.capacity_tokens + (config.block_size if graphs else 0), self.device, dtype)
        max_blocks = -(-self.max_model_len // config.block_size)
        self.block_tables = BlockTables(config.max_num_seqs, max_blocks)
        self.scheduler = Scheduler(
            self.block_manager, config.max_num_batched_tokens, config.max_num_seqs, config.max_loras, config.overtake_limit_s
        )
        self.adapters = AdapterManager(
            lora_slots, model.config, config.adapter_root, config.max_cpu_loras, self.scheduler.running_adapter_ids
        )
        self.decode_graphs = DecodeGraphs(
            self.model, self.kv,
            StaticDecodeBatch(config.max_num_seqs, max_blocks, self.block_manager.num_blocks, config.block_size, self.device),
            capture_sizes(config.max_num_seqs),
        ) if graphs else None
        self.output_processor = OutputProcessor(self.tokenizer)
        self._sequences: dict[str, Sequence] = {}
        self._generators: dict[str, torch.Generator] = {}
        self.num_preemptions = 0
        self.last_step: StepRecord | None = None  # what the latest step computed (for tracing); None: nothing
        self.last_forward_failed: bool | None = None  # whether the latest step's forward raised; None: it ran none
        # test seam: called with the batch inside the step's error handling, just before the forward;
        # an exception from it fails the step as a failing forward would (see tests/engine/test_engine_health.py)
        self.before_forward: Callable[[ScheduledBatch], None] | None = None
        log.info(
            "engine ready: %d params, KV %d tokens (%d x chunk %d) in %d blocks on %s; weights %s (%s), %.1f MB",
            model.config.num_parameters(), self.capacity_tokens, self.max_chunk_per_gpu,
            config.chunk_size, self.block_manager.num_blocks, self.device, config.dtype, quant, self.model.weight_bytes / 1e6,
        )

    # --- requests -------------------------------------------------------------------

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

    def add_request(self, request: EngineRequest) -> None:
        """Queue a request, or raise EngineError saying why it will not run."""
        adapter = self.adapters.get(request.adapter) if request.adapter is not None else None
        prompt = validate(
            request, self._sequences, self.config.chunk_size, self.model_config.vocab_size, self.max_model_len, time.time()
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
        self._generators[seq.request_id] = make_generator(request.sampling.seed, self.device)
        self.output_processor.add(seq.request_id)
        self.scheduler.add(seq)

    def abort(self, request_id: str, error: EngineError | None = None) -> RequestOutput | None:
        """Stop a request now and free its KV blocks: it ends ABORT, or with `error` when one is
        given; None if it is not here."""
        seq = self._sequences.get(request_id)
        if seq is None:
            return None
        return self._finish(seq, FinishReason.ABORT if error is None else FinishReason.ERROR, error)

    def unstarted_request_ids(self) -> list[str]:
        """Requests still waiting for their first step: nothing was computed or sent for them."""
        return [seq.request_id for seq in self.scheduler.waiting if seq.first_scheduled_time is None]

    # --- adapters -------------------------------------------------------------------

    def load_adapter(self, name: str, version: str, path: str, checksum: str | None = None) -> LoadedAdapter:
        """Make `name@version` servable from `path` under the adapter root; call it between steps,
        from the thread that steps the engine. Raises EngineError (INVALID_ARGUMENT, ADAPTER_NOT_FOUND)."""
        return self.adapters.load(AdapterRef(name, version), path, checksum)

    def read_adapter(self, name: str, version: str, path: str, checksum: str | None = None) -> ReadAdapter:
        """The slow part of a load (reading, hashing and parsing the files), which touches nothing
        the engine uses: any thread may call it, and `install_adapter` finishes the load."""
        return self.adapters.read(AdapterRef(name, version), path, checksum)

    def install_adapter(self, read: ReadAdapter) -> LoadedAdapter:
        """Make an adapter `read_adapter` returned servable; call it between steps, from the thread
        that steps the engine."""
        return self.adapters.register(read)

    def unload_adapter(self, name: str, version: str) -> bool:
        """Refuse new requests for `name@version`; those admitted already finish on it."""
        return self.adapters.unload(AdapterRef(name, version))

    @property
    def adapter_keys(self) -> list[str]:
        return self.adapters.keys

    def _assign_adapter_slots(self, batch: ScheduledBatch) -> list[RequestOutput]:
        """Put the adapter of each sequence admitted this step in its device slot; the scheduler
        admitted no more adapters than there are slots. Fails those whose adapter cannot be read again."""
        failed = []
        for seq in batch.admitted:
            if seq.adapter is None:
                continue
            try:
                seq.lora_slot = self.adapters.slot_for(seq.adapter)
            except EngineError as error:
                failed.append(self._finish(seq, FinishReason.ERROR, error))
        if failed:
            batch.items = [(seq, n) for seq, n in batch.items if not seq.is_finished]
        return failed

    # --- the loop ---------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        outputs = self._expire_deadlines()
        batch = self.scheduler.schedule()
        self.num_preemptions += len(batch.preempted)
        outputs += self._assign_adapter_slots(batch)
        self.last_step, self.last_forward_failed = None, None
        if not batch.items:
            return outputs
        now = time.monotonic()
        started_ns = time.time_ns()
        for seq, _ in batch.items:
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = now
        for seq in batch.preempted:
            self.block_tables.remove(seq.request_id)
        try:
            host = host_batch(batch.items, self.block_tables, self.config.block_size)
            if self.before_forward is not None:
                self.before_forward(batch)
            with torch.inference_mode():
                logits = self.decode_graphs.run(host) if self.decode_graphs is not None else None
                if logits is None:
                    logits = self.model.forward(to_device(host, self.config.block_size, self.device), self.kv)
            items = []
            for seq, n in batch.items:
                prefill = seq.num_computed_tokens < len(seq.prompt_token_ids)
                seq.prefill_slices += prefill
                self.scheduler.mark_computed(seq, n)
                items.append((seq.request_id, n, prefill))
            sampled = sample(
                logits,
                [seq.sampling for seq in host.sampled],
                [self._generators[seq.request_id] for seq in host.sampled],
            )
        except Exception as exc:  # a failed step fails its requests, never the engine
            log.exception("engine step failed; failing its %d requests", len(batch.items))
            self.last_forward_failed = True
            error = EngineError(ErrorCode.INTERNAL, f"engine step failed: {exc}")
            return outputs + [self._finish(seq, FinishReason.ERROR, error) for seq, _ in batch.items]
        self.last_forward_failed = False
        self.last_step = StepRecord(started_ns, time.time_ns(), tuple(items))
        token_time = time.monotonic()
        for seq, token in zip(host.sampled, sampled):
            if seq.first_token_time is None:
                seq.first_token_time = token_time
            seq.output_token_ids.append(token.token_id)
            output = self.output_processor.append(seq, token)
            if output.finished:
                self._release(seq, output.finish_reason)
            outputs.append(output)
        return outputs

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
        self.block_tables.remove(seq.request_id)
        seq.finish_reason = reason
        del self._sequences[seq.request_id]
        del self._generators[seq.request_id]
