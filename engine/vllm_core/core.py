"""K25's engine-core contract over vLLM's engine, in this process (vllm.v1's LLMEngine, its
engine core stepped by this thread; no HTTP server, no second process).

Each request is a K25 Sequence as well as a vLLM request: K25 checks it first (the same
refusals, CHUNK_SIZE_MISMATCH and the 92% KV guard included), vLLM computes its tokens, and
K25's output processor turns each one into the request's delta and decides where it ends (end
of sequence, stop ids and strings, max_tokens), so answers end and stream the same on both
backends; vLLM is told of an end it did not see and frees the KV at once."""

import logging
import os
import time

from common.tokenizer import load_tokenizer
from engine.base.config import EngineConfig
from engine.base.errors import EngineError, ErrorCode
from engine.core.admission import check_room, validate
from engine.core.contract import EngineLoad, StepRecord, StepResult
from engine.core.output_processor import OutputProcessor
from engine.core.request import EngineRequest, RequestOutput
from engine.core.sampling_params import SampledToken
from engine.core.sequence import FinishReason, Sequence
from engine.lora.adapter import AdapterRef, LoadedAdapter
from engine.vllm_core.adapters import VLLMAdapters
from engine.vllm_core.engine_plan import plan_engine
from engine.vllm_core.kv_events import EvictionCollector, KVEventTranslator
from engine.vllm_core.settings import BLOCK_SIZE, ONE_NODE, NodeGroup, sampling_kwargs

log = logging.getLogger(__name__)


class VLLMEngineCore:
    """Implements the engine-core contract (engine/core/contract.py) with vLLM."""

    def __init__(self, config: EngineConfig, model: str, tensor_parallel_size: int = 1, eager: bool = False,
                 group: NodeGroup = ONE_NODE):
        plan = plan_engine(config, model, tensor_parallel_size, eager, group)
        self.tokenizer = load_tokenizer(model)
        self.max_chunk_per_gpu = plan.kv.max_chunk_per_gpu
        self.capacity_tokens = plan.kv.max_chunk_per_gpu * config.chunk_size
        self.max_model_len = plan.max_model_len
        self.vocab_size = plan.vocab_size
        self.config = plan.config
        # read by vLLM when it is imported: the engine core runs in this thread
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.update(plan.env)
        from vllm.v1.engine.llm_engine import LLMEngine

        log.info("vLLM engine: %s, %s, %d KV blocks of %d tokens", plan.folder, plan.config.dtype, plan.kv.blocks - 1,
                 BLOCK_SIZE)
        self._llm = LLMEngine.from_engine_args(plan.vllm_engine_args())
        # the scheduler of the engine core this process runs: its queue lengths and KV use are the load,
        # its requests' block hashes and its KV events what the prefix-cache announcements translate
        self._scheduler = self._llm.engine_core.engine_core.scheduler
        self._kv_events = KVEventTranslator(BLOCK_SIZE)
        if config.prefix_caching:
            self._scheduler.kv_event_publisher = EvictionCollector(self._kv_events)
        self._adapters = VLLMAdapters(self._llm, config.max_loras, config.adapter_root)
        self.output_processor = OutputProcessor(self.tokenizer)
        self._sequences: dict[str, Sequence] = {}
        self._lora_of: dict[str, str] = {}  # request id -> name@version of its adapter
        self._vllm_ids: dict[str, str] = {}  # request id -> vLLM's (it adds a suffix of its own)
        self._prefix = [0, 0]  # prompt tokens looked up in the prefix cache, and found there

    # --- load -------------------------------------------------------------------------

    @property
    def kv_usage(self) -> float:
        return float(self._scheduler.kv_cache_manager.usage)

    def has_unfinished(self) -> bool:
        return bool(self._sequences)

    def load(self) -> EngineLoad:
        running, waiting = self._scheduler.get_request_counts()
        return EngineLoad(running=running, waiting=waiting, kv_usage=self.kv_usage, adapters=tuple(self.adapter_keys),
                          prefix_queried_tokens=self._prefix[0], prefix_hit_tokens=self._prefix[1])

    def set_kv_events(self, enabled: bool) -> None:
        self._kv_events.enabled = enabled
        if not enabled:
            self._kv_events.take()

    def close(self) -> None:
        """Nothing to release: vLLM keeps no KV tier below the device, and its engine core runs
        in this thread, ending with the process."""

    def drain(self) -> list[str]:
        self.set_kv_events(False)
        return [rid for rid, seq in self._sequences.items() if seq.first_scheduled_time is None
                and getattr(self._vllm_request(rid), "num_computed_tokens", 0) == 0]

    # --- requests ---------------------------------------------------------------------

    def add_request(self, request: EngineRequest) -> None:
        from vllm import SamplingParams
        from vllm.exceptions import VLLMValidationError
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        prompt = validate(request, self._sequences, self.config.chunk_size, self.vocab_size, self.max_model_len, time.time())
        _, waiting = self._scheduler.get_request_counts()
        check_room(waiting, self.config.max_waiting, self.kv_usage, self.config.kv_admission_limit)
        lora = self._adapters.request_for(request.adapter) if request.adapter is not None else None
        kwargs = sampling_kwargs(request.sampling, self.tokenizer.eos_token_ids)
        structured = kwargs.pop("structured", None)
        prompt_input = {"prompt_token_ids": prompt} | ({"cache_salt": request.cache_salt} if request.cache_salt else {})
        try:
            params = SamplingParams(**kwargs, output_kind=RequestOutputKind.DELTA,
                                    structured_outputs=StructuredOutputsParams(**structured) if structured else None)
            vllm_id = self._llm.add_request(request.request_id, prompt_input, params, lora_request=lora)
        except (ValueError, VLLMValidationError) as exc:  # vLLM's own refusal of what K25's checks let through
            raise EngineError(ErrorCode.INVALID_ARGUMENT, str(exc)) from None
        seq = Sequence(request.request_id, prompt, request.sampling, request.pad_length, request.deadline,
                       cache_salt=request.cache_salt)
        self._sequences[seq.request_id] = seq
        self._vllm_ids[seq.request_id] = vllm_id
        if lora is not None:
            self._lora_of[seq.request_id] = request.adapter.key
        self.output_processor.add(seq.request_id)

    def abort(self, request_id: str, error: EngineError | None = None) -> RequestOutput | None:
        seq = self._sequences.get(request_id)
        if seq is None:
            return None
        self._llm.abort_request([request_id])
        return self._finish(seq, FinishReason.ABORT if error is None else FinishReason.ERROR, error)

    # --- adapters ---------------------------------------------------------------------

    def read_adapter(self, name: str, version: str, path: str, checksum: str | None = None):
        return self._adapters.read(AdapterRef(name, version), path, checksum)

    def install_adapter(self, read) -> LoadedAdapter:
        return self._adapters.install(read)

    def load_adapter(self, name: str, version: str, path: str, checksum: str | None = None) -> LoadedAdapter:
        return self.install_adapter(self.read_adapter(name, version, path, checksum))

    def unload_adapter(self, name: str, version: str) -> bool:
        return self._adapters.unload(AdapterRef(name, version), in_use=set(self._lora_of.values()))

    @property
    def adapter_keys(self) -> list[str]:
        return self._adapters.keys

    # --- the loop ---------------------------------------------------------------------

    def step(self) -> StepResult:
        outputs = self._expire_deadlines()
        if not self._sequences:
            return StepResult(outputs)
        started_ns = time.time_ns()
        try:
            produced = self._llm.step()
        except Exception as exc:  # a failed step fails its requests, never the engine
            log.exception("vLLM step failed; failing its %d requests", len(self._sequences))
            error = EngineError(ErrorCode.INTERNAL, f"engine step failed: {exc}")
            for seq in list(self._sequences.values()):
                outputs.append(self.abort(seq.request_id, error))
            return StepResult(outputs, forward_failed=True)
        items = []
        for out in produced:
            seq = self._sequences.get(out.request_id)
            if seq is not None:
                items.append(self._take(seq, out, started_ns, outputs))
        kv_events = self._kv_events.take()
        if not items:
            return StepResult(outputs, kv_events=kv_events)
        record = StepRecord(started_ns, time.time_ns(), tuple(items))
        return StepResult(outputs, record, forward_failed=False, kv_events=kv_events)

    def _take(self, seq: Sequence, out, started_ns: int, outputs: list[RequestOutput]) -> tuple[str, int, bool]:
        """Hand the step's new tokens of one request to the output processor; the step record's item."""
        completion = out.outputs[0]
        prefill = seq.first_token_time is None
        if prefill:
            seq.first_scheduled_time = seq.first_scheduled_time or time.monotonic()
            seq.num_cached_tokens = out.num_cached_tokens or 0
            seq.prefill_slices = 1
            self._prefix[0] += len(seq.prompt_token_ids)
            self._prefix[1] += seq.num_cached_tokens
            self._announce_prompt(seq)
        now = time.monotonic()
        for i, token in enumerate(completion.token_ids):
            seq.first_token_time = seq.first_token_time or now
            seq.output_token_ids.append(token)
            output = self.output_processor.append(seq, _sampled(token, completion.logprobs, i, seq.sampling.logprobs))
            outputs.append(output)
            if output.finished:
                if not out.finished:
                    self._llm.abort_request([seq.request_id])
                self._release(seq)
                break
        else:
            if out.finished:  # vLLM ended it where K25's rules saw no end (its context is full)
                outputs.append(self._finish(seq, FinishReason.LENGTH))
        computed = len(seq.prompt_token_ids) - seq.num_cached_tokens if prefill else len(completion.token_ids)
        return seq.request_id, computed, prefill

    def _vllm_request(self, request_id: str):
        """vLLM's scheduler's record of a request (None once it has finished there)."""
        return self._scheduler.requests.get(self._vllm_ids.get(request_id))

    def _announce_prompt(self, seq: Sequence) -> None:
        from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

        vllm_request = self._vllm_request(seq.request_id)
        if vllm_request is None or not self.config.prefix_caching:
            return
        hashes = [maybe_convert_block_hash(h) for h in vllm_request.block_hashes]  # as its KV events name them
        self._kv_events.prompt_cached(seq.prompt_token_ids, self._lora_of.get(seq.request_id, ""), seq.cache_salt, hashes)

    def _expire_deadlines(self) -> list[RequestOutput]:
        now = time.time()
        error = EngineError(ErrorCode.DEADLINE_EXCEEDED, "deadline passed before the request finished")
        return [self.abort(s.request_id, error) for s in list(self._sequences.values())
                if s.deadline is not None and s.deadline <= now]

    def _finish(self, seq: Sequence, reason: FinishReason, error: EngineError | None = None) -> RequestOutput:
        self._release(seq)
        return self.output_processor.finish(seq, reason, error)

    def _release(self, seq: Sequence) -> None:
        del self._sequences[seq.request_id]
        del self._vllm_ids[seq.request_id]
        if self._lora_of.pop(seq.request_id, None) is not None:
            self._adapters.forget_unused(set(self._lora_of.values()))


def _sampled(token: int, logprobs, index: int, wanted: int | None) -> SampledToken:
    """The token with its logprob and the top `wanted` (best first), from vLLM's per-token dict."""
    if wanted is None or not logprobs:
        return SampledToken(token)
    ranked = logprobs[index]
    top = sorted(((t, lp) for t, lp in ranked.items() if lp.rank is not None and lp.rank <= wanted), key=lambda x: x[1].rank)
    return SampledToken(token, ranked[token].logprob, tuple((t, lp.logprob) for t, lp in top[:wanted]))
