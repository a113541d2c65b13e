"""The model runner: everything on the device. It builds the model and sizes its KV cache to the
memory budget, keeps each running request's block-table row and sampling generator, and runs a
scheduled batch: host arrays, then a captured decode graph or the eager forward, then sampling."""

import logging
from collections.abc import Callable

import torch

from common.quant_spec import NO_QUANT, QuantSpecError, parse_quant_spec
from engine.attention.kv_cache import KVCache
from engine.base.config import EngineConfig
from engine.base.errors import EngineConfigError, EngineError
from engine.core.sampling_params import SampledToken
from engine.core.scheduler import ScheduledBatch
from engine.core.sequence import Sequence
from engine.kv_tiers.setup import build_tier_store
from engine.lora.manager import AdapterManager
from engine.lora.settings import check_lora_settings
from engine.lora.slots import LoRASlots
from engine.model.llama import LlamaModel
from engine.model.loader import LoadedModel
from engine.quant.check import check_quant
from engine.runner.block_tables import BlockTables
from engine.runner.decode_graphs import DecodeGraphs, StaticDecodeBatch, capture_sizes, graphs_enabled
from engine.runner.forward_batch import host_batch, to_device
from engine.runner.memory_budget import fit_max_chunk_per_gpu
from engine.runner.penalties import apply_penalties
from engine.runner.sampler import make_generator, sample
from engine.structured.grammar_cache import GrammarCache
from engine.structured.token_masks import ConstrainedRequests

log = logging.getLogger(__name__)


class ModelRunner:
    """Implements the core's ModelExecutor (engine/core/executor.py) on one device."""

    def __init__(self, model: LoadedModel, config: EngineConfig, adapters_in_use: Callable[[], set[int]]):
        check_lora_settings(config)
        self.config = config
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
        self.vocab_size = model.config.vocab_size
        weight_bytes = self.model.weight_bytes + (lora_slots.nbytes if lora_slots else 0)
        self.max_chunk_per_gpu = fit_max_chunk_per_gpu(config, model.config, self.device, dtype, weight_bytes)
        self.capacity_tokens = self.max_chunk_per_gpu * config.chunk_size
        self.max_model_len = min(self.capacity_tokens, model.config.max_position_embeddings)
        self.num_kv_blocks = self.capacity_tokens // config.block_size
        graphs = graphs_enabled(config, self.device)
        # with graphs, one block more than the core hands out: the decode graphs' padding writes there
        self.kv = KVCache(model.config, self.capacity_tokens + (config.block_size if graphs else 0), self.device, dtype)
        self.lower_tiers = build_tier_store(config, model.source, repr(model.config), self.kv, self.max_model_len)
        max_blocks = -(-self.max_model_len // config.block_size)
        self.block_tables = BlockTables(config.max_num_seqs, max_blocks)
        self.adapters = AdapterManager(lora_slots, model.config, config.adapter_root, config.max_cpu_loras, adapters_in_use)
        self.decode_graphs = DecodeGraphs(
            self.model, self.kv,
            StaticDecodeBatch(config.max_num_seqs, max_blocks, self.num_kv_blocks, config.block_size, self.device),
            capture_sizes(config.max_num_seqs),
        ) if graphs else None
        self._generators: dict[str, torch.Generator] = {}
        self._tokenizer = model.tokenizer
        self._constrained: ConstrainedRequests | None = None  # built with the first constraint
        # test and fault-injection seam (`k25 engine --inject-step-failures-while`): called with the batch
        # just before the forward; an exception from it fails the step as a failing forward would
        self.before_forward: Callable[[ScheduledBatch], None] | None = None
        log.info(
            "model runner ready: %d params, KV %d tokens (%d x chunk %d) in %d blocks on %s; weights %s (%s), %.1f MB",
            model.config.num_parameters(), self.capacity_tokens, self.max_chunk_per_gpu,
            config.chunk_size, self.num_kv_blocks, self.device, config.dtype, quant, self.model.weight_bytes / 1e6,
        )

    def add(self, seq: Sequence) -> None:
        self._generators[seq.request_id] = make_generator(seq.sampling.seed, self.device)
        if seq.sampling.constraint is not None:
            if self._constrained is None:
                self._constrained = ConstrainedRequests(GrammarCache(self._tokenizer), self.vocab_size)
            self._constrained.add(seq.request_id, seq.sampling.constraint)

    def forget_blocks(self, request_id: str) -> None:
        self.block_tables.remove(request_id)

    def finish(self, request_id: str) -> None:
        self.block_tables.remove(request_id)
        del self._generators[request_id]
        if self._constrained is not None:
            self._constrained.drop(request_id)

    def execute(self, batch: ScheduledBatch) -> list[tuple[Sequence, SampledToken]]:
        host = host_batch(batch.items, self.block_tables, self.config.block_size)
        if self.before_forward is not None:
            self.before_forward(batch)
        with torch.inference_mode():
            if self.lower_tiers is not None and (batch.offload or batch.restore):
                self.lower_tiers.apply(batch.offload, batch.restore)
            logits = self.decode_graphs.run(host) if self.decode_graphs is not None else None
            if logits is None:
                logits = self.model.forward(to_device(host, self.config.block_size, self.device), self.kv)
            apply_penalties(logits, [seq.sampling for seq in host.sampled], [seq.prompt_token_ids for seq in host.sampled],
                            [seq.output_token_ids for seq in host.sampled])
            failed = self._mask(logits, host.sampled)
            sampled = sample(
                logits, [seq.sampling for seq in host.sampled], [self._generators[seq.request_id] for seq in host.sampled]
            )
        self._advance(host.sampled, sampled, failed)
        return list(zip(host.sampled, sampled))

    def _mask(self, logits: torch.Tensor, rows: list[Sequence]) -> dict[int, EngineError]:
        """Mask the constrained rows' logits; the rows whose constraint failed to compile, with why."""
        if self._constrained is None:
            return {}
        matchers, failed = [], {}
        for row, seq in enumerate(rows):
            if seq.request_id in self._constrained:
                try:
                    matchers.append((self._constrained.matcher(seq.request_id), row))
                except EngineError as error:
                    failed[row] = error
        if matchers:
            self._constrained.mask_logits(logits, matchers)
        return failed

    def _advance(self, rows: list[Sequence], sampled: list[SampledToken], failed: dict[int, EngineError]) -> None:
        """Each constrained row's matcher consumes its token; a failed row carries its error instead."""
        if self._constrained is None:
            return
        for row, seq in enumerate(rows):
            error = failed.get(row)
            if error is None and seq.request_id in self._constrained:
                error = self._constrained.consume(self._constrained.matcher(seq.request_id), sampled[row].token_id)
            if error is not None:
                sampled[row] = SampledToken(sampled[row].token_id, error=error)
