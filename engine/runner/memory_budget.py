"""How many KV chunks fit beside the weights and one step's activations, checked at start."""

import logging
from dataclasses import dataclass

import torch

from engine.attention.kv_cache import kv_bytes_per_token
from engine.base.config import EngineConfig
from engine.base.model_config import ModelConfig
from engine.hardware.chunk_choice import AUTO, auto_max_chunk_per_gpu
from engine.hardware.profiles import GIB, largest_max_chunk_per_gpu, resolve_max_chunk_per_gpu
from engine.runner.decode_graphs import graphs_enabled

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MemoryPlan:
    """The bytes the start-time check counts (`k25 bench profile` prints them)."""
    budget_bytes: int
    weight_bytes: int  # includes the LoRA slots
    activation_bytes: int  # one step's widest intermediates
    chunk_kv_bytes: int  # the KV of chunk_size tokens

    @property
    def largest_max_chunk_per_gpu(self) -> int:
        return largest_max_chunk_per_gpu(self.budget_bytes, self.weight_bytes, self.activation_bytes, self.chunk_kv_bytes)


def memory_budget_bytes(config: EngineConfig, device: torch.device) -> int:
    """What weights, activations and KV may use together on `device`."""
    if device.type == "cuda":
        _, total = torch.cuda.mem_get_info(device)
        return int(total * config.gpu_memory_utilization)
    return int(config.cpu_memory_budget_gib * GIB)


def activation_reserve_bytes(config: EngineConfig, model_config: ModelConfig, dtype: torch.dtype, graphs: bool = False) -> int:
    # the widest intermediates of one step: the MLP's gate/up rows for the whole token budget,
    # the attention scores of one prefill slice against the longest context, and the logits.
    # Decode graphs (engine/runner/decode_graphs.py) keep a pool of their own, a decode step's at
    # max_num_seqs rows, and a scratch KV block.
    c = model_config

    def mlp_bytes(rows: int) -> int:
        return rows * (3 * c.intermediate_size + 4 * c.hidden_size) * dtype.itemsize

    scores = config.max_num_batched_tokens * c.max_position_embeddings * c.num_heads * 4
    logits = config.max_num_seqs * c.vocab_size * 4
    graph_pool = mlp_bytes(config.max_num_seqs) + logits
    scratch_block = config.block_size * kv_bytes_per_token(c, dtype)
    return mlp_bytes(config.max_num_batched_tokens) + min(scores, GIB) + logits + (graph_pool + scratch_block if graphs else 0)


def memory_plan(
    config: EngineConfig, model_config: ModelConfig, device: torch.device, dtype: torch.dtype, weight_bytes: int
) -> MemoryPlan:
    reserve = activation_reserve_bytes(config, model_config, dtype, graphs_enabled(config, device))
    return MemoryPlan(memory_budget_bytes(config, device), weight_bytes, reserve,
                      config.chunk_size * kv_bytes_per_token(model_config, dtype))


def fit_max_chunk_per_gpu(
    config: EngineConfig, model_config: ModelConfig, device: torch.device, dtype: torch.dtype, weight_bytes: int
) -> int:
    """The max_chunk_per_gpu to run with (asked for, auto, the node type's, or the largest that
    fits); raises EngineConfigError if it does not fit. `weight_bytes` includes the LoRA slots."""
    plan = memory_plan(config, model_config, device, dtype, weight_bytes)
    requested = config.max_chunk_per_gpu
    if requested == AUTO:
        choice = auto_max_chunk_per_gpu(plan.largest_max_chunk_per_gpu, config.expected_chunks_per_request,
                                        config.max_num_seqs)
        log.info("max_chunk_per_gpu %d (%s)", choice.value, choice.reason)
        requested = choice.value
    return resolve_max_chunk_per_gpu(
        requested, config.node_type, plan.budget_bytes, plan.weight_bytes, plan.activation_bytes, plan.chunk_kv_bytes
    )
