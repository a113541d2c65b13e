"""The engine loop: admit requests, schedule a step, run the model, sample, stream deltas."""

import logging
import time
from dataclasses import dataclass, field

import torch

from common.tokenizer import IncrementalDetokenizer
from engine.base.config import EngineConfig
from engine.base.errors import EngineConfigError, EngineError, ErrorCode
from engine.block_manager import BlockManager
from engine.forward_batch import build_forward_batch
from engine.hardware import GIB, resolve_max_chunk_per_gpu
from engine.kv_cache import KVCache, kv_bytes_per_token
from engine.loader import LoadedModel
from engine.lora.adapter import AdapterRef, LoadedAdapter
from engine.lora.manager import AdapterManager
from engine.lora.settings import check_lora_settings
from engine.lora.slots import LoRASlots
from engine.model import LlamaModel
from engine.sampler import SampledToken, make_generator, sample
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import FinishReason, Sequence

log = logging.getLogger(__name__)


@dataclass
class EngineRequest:
    request_id: str
    prompt_token_ids: list[int]  # padded: a multiple of chunk_size, pads at the end
    sampling: SamplingParams
    chunk_size: int  # the chunk_size the caller padded for
    pad_length: int = 0
    deadline: float | None = None  # time.time() seconds
    adapter: AdapterRef | None = None  # None: the base model


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    pad_tokens: int


@dataclass
class Timings:
    queued_s: float
    time_to_first_token_s: float
    total_s: float
    prefill_chunks: int
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


@dataclass
class _Stream:
    """Per-request state the scheduler does not need: detokenising and stop strings."""

    detokenizer: IncrementalDetokenizer
    generator: torch.Generator
    text: str = ""
    emitted_chars: int = 0


@dataclass(frozen=True)
class StepRecord:
    """What one engine step computed: for each request, how many tokens and whether they
    were part of its prompt (a prefill chunk) or a decode."""

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
        self.model = LlamaModel(model.config, model.weights, self.device, dtype, lora_slots)
        self.max_chunk_per_gpu = resolve_max_chunk_per_gpu(
            config.max_chunk_per_gpu,
            config.node_type,
            self._memory_budget_bytes(),
            self.model.weight_bytes + (lora_slots.nbytes if lora_slots else 0),
            self._activation_reserve_bytes(dtype),
            config.chunk_size * kv_bytes_per_token(model.config, dtype),
        )
        self.capacity_tokens = self.max_chunk_per_gpu * config.chunk_size
        self.max_model_len = min(self.capacity_tokens, model.config.max_position_embeddings)
        self.block_manager = BlockManager(self.capacity_tokens // config.block_size, config.block_size)
        self.kv = KVCache(model.config, self.capacity_tokens, self.device, dtype)
        self.scheduler = Scheduler(self.block_manager, config.max_num_batched_tokens, config.max_num_seqs)
        self._sequences: dict[str, Sequence] = {}
        self.adapters = AdapterManager(lora_slots, model.config, config.adapter_root, config.max_cpu_loras, self._adapters_in_use)
        # requests whose adapter waits for a free slot, in arrival order; they enter the scheduler once it has one
        self._waiting_for_slot: list[Sequence] = []
        self._streams: dict[str, _Stream] = {}
        self.num_preemptions = 0
        self.last_step: StepRecord | None = None  # what the latest step computed (for tracing)
        log.info(
            "engine ready: %d params, KV %d tokens (%d x chunk %d) in %d blocks on %s",
            model.config.num_parameters(), self.capacity_tokens, self.max_chunk_per_gpu,
            config.chunk_size, self.block_manager.num_blocks, self.device,
        )

    def _memory_budget_bytes(self) -> int:
        if self.device.type == "cuda":
            _, total = torch.cuda.mem_get_info(self.device)
            return int(total * self.config.gpu_memory_utilization)
        return int(self.config.cpu_memory_budget_gib * GIB)

    def _activation_reserve_bytes(self, dtype: torch.dtype) -> int:
        # the widest intermediates of one step: the MLP's gate/up rows for the whole token budget,
        # the attention scores of one prompt chunk against the longest context, and the logits.
        c, cfg = self.model_config, self.config
        mlp = cfg.max_num_batched_tokens * (3 * c.intermediate_size + 4 * c.hidden_size) * dtype.itemsize
        scores = cfg.max_num_batched_tokens * c.max_position_embeddings * c.num_heads * 4
        logits = cfg.max_num_seqs * c.vocab_size * 4
        return mlp + min(scores, GIB) + logits

    # --- requests -------------------------------------------------------------------

    @property
    def kv_usage(self) -> float:
        return self.block_manager.usage

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting) + len(self._waiting_for_slot)

    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished + len(self._waiting_for_slot) > 0

    def add_request(self, request: EngineRequest) -> None:
        """Queue a request, or raise EngineError saying why it will not run."""
        adapter = self.adapters.get(request.adapter) if request.adapter is not None else None
        prompt = self._validate(request)
        seq = Sequence(
            request_id=request.request_id,
            prompt_token_ids=prompt,
            sampling=request.sampling,
            pad_length=request.pad_length,
            deadline=request.deadline,
            adapter=adapter,
        )
        self._sequences[seq.request_id] = seq
        self._streams[seq.request_id] = _Stream(IncrementalDetokenizer(self.tokenizer), make_generator(request.sampling.seed))
        if adapter is None:
            self.scheduler.add(seq)
        else:  # enters the scheduler at the next step, once its adapter has a slot
            self._waiting_for_slot.append(seq)

    def _validate(self, request: EngineRequest) -> list[int]:
        invalid = ErrorCode.INVALID_ARGUMENT
        if not request.request_id:
            raise EngineError(invalid, "request_id must not be empty")
        if request.request_id in self._sequences:
            raise EngineError(invalid, f"request_id {request.request_id!r} is already running")
        if request.chunk_size != self.config.chunk_size:
            raise EngineError(
                ErrorCode.CHUNK_SIZE_MISMATCH,
                f"request was padded for chunk_size {request.chunk_size}; this engine's chunk_size is {self.config.chunk_size}",
            )
        padded = len(request.prompt_token_ids)
        if padded % self.config.chunk_size:
            raise EngineError(
                ErrorCode.CHUNK_SIZE_MISMATCH,
                f"padded prompt length {padded} is not a multiple of chunk_size {self.config.chunk_size}",
            )
        if not 0 <= request.pad_length < padded:
            raise EngineError(invalid, f"pad_length {request.pad_length} leaves no prompt in {padded} tokens")
        prompt = list(request.prompt_token_ids[: padded - request.pad_length])
        vocab = self.model_config.vocab_size
        if any(not 0 <= t < vocab for t in prompt):
            raise EngineError(invalid, f"prompt has token ids outside the vocabulary [0, {vocab})")
        request.sampling.validate(vocab)
        needed = len(prompt) + request.sampling.max_tokens
        if needed > self.max_model_len:
            raise EngineError(
                invalid,
                f"prompt ({len(prompt)} tokens) + max_tokens ({request.sampling.max_tokens}) = {needed} "
                f"exceeds this engine's context of {self.max_model_len} tokens",
            )
        if request.deadline is not None and request.deadline <= time.time():
            raise EngineError(ErrorCode.DEADLINE_EXCEEDED, "the request's deadline has already passed")
        if self.num_waiting >= self.config.max_waiting:
            raise EngineError(ErrorCode.RESOURCE_EXHAUSTED, f"queue full ({self.num_waiting} waiting)")
        if self.kv_usage > self.config.kv_admission_limit:
            raise EngineError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"KV cache {self.kv_usage:.0%} full (limit {self.config.kv_admission_limit:.0%})",
            )
        return prompt

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request now and free its KV blocks; None if it is not here."""
        seq = self._sequences.get(request_id)
        if seq is None:
            return None
        return self._finish(seq, FinishReason.ABORT)

    # --- adapters -------------------------------------------------------------------

    def load_adapter(self, name: str, version: str, path: str, checksum: str | None = None) -> LoadedAdapter:
        """Make `name@version` servable from `path` under the adapter root; call it between steps,
        from the thread that steps the engine. Raises EngineError (INVALID_ARGUMENT, ADAPTER_NOT_FOUND)."""
        return self.adapters.load(AdapterRef(name, version), path, checksum)

    def unload_adapter(self, name: str, version: str) -> bool:
        """Refuse new requests for `name@version`; those admitted already finish on it."""
        return self.adapters.unload(AdapterRef(name, version))

    @property
    def adapter_keys(self) -> list[str]:
        return self.adapters.keys

    def _adapters_in_use(self) -> set[int]:
        return {s.adapter.id for s in (*self.scheduler.waiting, *self.scheduler.running) if s.adapter is not None}

    def _schedule_adapter_requests(self) -> list[RequestOutput]:
        """Move requests whose adapter has (or can now get) a device slot into the scheduler."""
        failed = []
        for seq in list(self._waiting_for_slot):
            try:
                slot = self.adapters.slot_for(seq.adapter)
            except EngineError as error:
                failed.append(self._finish(seq, FinishReason.ERROR, error))
                continue
            if slot is not None:
                seq.lora_slot = slot
                self._waiting_for_slot.remove(seq)
                self.scheduler.add(seq)
        return failed

    # --- the loop ---------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        outputs = self._expire_deadlines()
        outputs += self._schedule_adapter_requests()
        batch = self.scheduler.schedule()
        self.num_preemptions += len(batch.preempted)
        if not batch.items:
            return outputs
        now = time.monotonic()
        started_ns = time.time_ns()
        for seq, _ in batch.items:
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = now
        forward = build_forward_batch(batch.items, self.config.block_size, self.device)
        try:
            with torch.inference_mode():
                logits = self.model.forward(forward, self.kv)
            items = []
            for seq, n in batch.items:
                prefill = seq.num_computed_tokens < len(seq.prompt_token_ids)
                seq.prefill_chunks += prefill
                seq.num_computed_tokens += n
                items.append((seq.request_id, n, prefill))
            sampled = sample(
                logits,
                [seq.sampling for seq in forward.sampled],
                [self._streams[seq.request_id].generator for seq in forward.sampled],
            )
        except Exception as exc:  # a failed step fails its requests, never the engine
            log.exception("engine step failed; failing its %d requests", len(batch.items))
            error = EngineError(ErrorCode.INTERNAL, f"engine step failed: {exc}")
            return outputs + [self._finish(seq, FinishReason.ERROR, error) for seq, _ in batch.items]
        self.last_step = StepRecord(started_ns, time.time_ns(), tuple(items))
        for seq, token in zip(forward.sampled, sampled):
            outputs.append(self._append_token(seq, token))
        return outputs

    def _expire_deadlines(self) -> list[RequestOutput]:
        now = time.time()
        expired = [s for s in self._sequences.values() if s.deadline is not None and s.deadline <= now]
        error = EngineError(ErrorCode.DEADLINE_EXCEEDED, "deadline passed before the request finished")
        return [self._finish(seq, FinishReason.ERROR, error) for seq in expired]

    def _append_token(self, seq: Sequence, sampled: SampledToken) -> RequestOutput:
        if seq.first_token_time is None:
            seq.first_token_time = time.monotonic()
        token = sampled.token_id
        seq.output_token_ids.append(token)
        stream = self._streams[seq.request_id]
        params = seq.sampling
        reason, stop_at = None, None
        if (not params.ignore_eos and token in self.tokenizer.eos_token_ids) or token in params.stop_token_ids:
            reason = FinishReason.STOP
        else:
            stream.text += stream.detokenizer.push(token)
            stop_at = _find_stop(stream.text, params.stop, stream.emitted_chars)
            if stop_at is not None:
                stream.text = stream.text[:stop_at]
                reason = FinishReason.STOP
        if reason is None and len(seq.output_token_ids) >= params.max_tokens:
            reason = FinishReason.LENGTH
        if reason is not None and stop_at is None:
            stream.text += stream.detokenizer.finish()  # bytes held back for a character never completed
        output = RequestOutput(seq.request_id, token_ids=[token], logprobs=[sampled] if params.logprobs is not None else [])
        if reason is not None:
            final = self._finish(seq, reason)
            final.token_ids, final.logprobs = output.token_ids, output.logprobs
            return final
        # hold back text that could still become the start of a stop string
        holdback = max((len(s) for s in params.stop), default=1) - 1
        safe_end = max(stream.emitted_chars, len(stream.text) - holdback)
        output.text = stream.text[stream.emitted_chars : safe_end]
        stream.emitted_chars = safe_end
        return output

    def _finish(self, seq: Sequence, reason: FinishReason, error: EngineError | None = None) -> RequestOutput:
        if seq in self._waiting_for_slot:
            self._waiting_for_slot.remove(seq)
        self.scheduler.finish(seq)
        seq.finish_reason = reason
        stream = self._streams.pop(seq.request_id)
        del self._sequences[seq.request_id]
        now = time.monotonic()
        text = stream.text[stream.emitted_chars :] if reason in (FinishReason.STOP, FinishReason.LENGTH) else ""
        return RequestOutput(
            seq.request_id,
            text=text,
            finish_reason=reason,
            error=error,
            usage=Usage(len(seq.prompt_token_ids), len(seq.output_token_ids), seq.pad_length),
            timings=Timings(
                queued_s=(seq.first_scheduled_time or now) - seq.arrival_time,
                time_to_first_token_s=(seq.first_token_time or now) - seq.arrival_time,
                total_s=now - seq.arrival_time,
                prefill_chunks=seq.prefill_chunks,
                preemptions=seq.preemptions,
            ),
        )


def _find_stop(text: str, stops: tuple[str, ...], emitted_chars: int) -> int | None:
    """Index where the earliest stop string starts in the not-yet-emitted tail, if any."""
    hits = [i for s in stops if (i := text.find(s, max(0, emitted_chars - len(s) + 1))) != -1]
    return min(hits) if hits else None
