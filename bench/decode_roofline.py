"""`k25 bench gpu`, section decode_roofline: the engine's decode step at several batch sizes
against the memory-bandwidth limit measured in the same run (on CUDA the GPU's HBM): a step must
read every weight once and each sequence's KV, so it cannot be faster than those bytes over the
bandwidth. The step and the bytes are `k25 bench engine`'s (bench/engine_bench.py)."""

import math

import torch

from bench.engine_bench import decode_step_seconds, memory_bandwidth
from engine.base.config import EngineConfig
from engine.model.loader import load_model
from engine.runner.decode_graphs import graphs_enabled


def decode_roofline(model: str, device: str, dtype: str, batches: list[int], context: int, steps: int, chunk_size: int,
                    bandwidth_bytes: int) -> dict:
    """Median step of `steps` decode steps at each batch size, `context` prompt tokens a sequence,
    with the engine's own settings (CUDA graphs where CUDA is) but the KV sized to the batch and no
    host tier (nothing is evicted here; on CUDA its pinned gigabytes would only slow each engine's start)."""
    loaded = load_model(model, getattr(torch, dtype))
    bandwidth = memory_bandwidth(bandwidth_bytes, device=device)
    rows = []
    for batch in batches:
        # a sequence's padded prompt and its steps (decode_step_seconds runs steps + 2) in KV chunks, one to spare
        chunks = batch * (math.ceil((math.ceil(context / chunk_size) * chunk_size + steps + 2) / chunk_size) + 1)
        config = EngineConfig(device=device, dtype=dtype, chunk_size=chunk_size, max_num_seqs=batch, max_chunk_per_gpu=chunks,
                              kv_host_tier_gib=0)
        seconds, bytes_read = decode_step_seconds(loaded, config, context, steps, batch)
        limit_s = bytes_read / bandwidth
        rows.append({"batch": batch, "step_ms": seconds * 1e3, "bytes_read": bytes_read, "bandwidth_limit_ms": limit_s * 1e3,
                     "step_over_bandwidth_limit": seconds / limit_s})
    return {"model": model, "dtype": dtype, "context_tokens": context, "steps": steps,
            "cuda_graphs": graphs_enabled(EngineConfig(), torch.device(device)), "memory_bandwidth_bytes_per_s": bandwidth, "batches": rows}
