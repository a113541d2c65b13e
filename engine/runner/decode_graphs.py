"""CUDA graphs for decode steps (EngineConfig.cuda_graphs, `k25 engine --no-cuda-graphs` to turn
them off; CUDA only: a CPU engine never captures).

At small batch a decode step's time is its kernel launches, not their work: SmolLM2's forward
launches some 15 kernels a layer over 30 layers, each a few microseconds of host time, against
a step whose weights an H100 reads in about a tenth of a millisecond. A graph replays a whole
forward pass of a decode batch of one size (a bucket, `capture_sizes`) with one launch, from
input tensors that stay where they were at capture (`StaticDecodeBatch`).

Padding. A step of n decodes writes its inputs into the first n rows and runs the smallest
bucket that holds them; the bucket's other rows are sequences of one token at position 0 whose
K/V goes to a scratch block that the block manager never hands out (the cache holds one block
more than it manages), so padding reads and writes nothing a sequence owns; their logits are
computed and dropped. Steps with a prefill slice or LoRA tokens, and steps of more decodes than
the largest bucket, run eagerly.

Capture and replay have not yet run on a GPU (the README's status says where each part was
verified). The padding they rely on is tested on a CPU against the eager forward
(tests/engine/runner/test_decode_graphs.py); the tests of capture and replay there run where CUDA is."""

import logging
import time
from bisect import bisect_left

import numpy as np
import torch

from engine.attention.kv_cache import KVCache
from engine.attention.metadata import ForwardBatch
from engine.base.config import EngineConfig
from engine.base.errors import EngineConfigError
from engine.runner.forward_batch import HostBatch

log = logging.getLogger(__name__)


def graphs_enabled(config: EngineConfig, device: torch.device) -> bool:
    return config.cuda_graphs and device.type == "cuda"


def capture_sizes(max_num_seqs: int) -> list[int]:
    """The buckets: 1, 2, 4, then every multiple of 8 below max_num_seqs, and max_num_seqs."""
    return sorted({size for size in (1, 2, 4) if size < max_num_seqs} | set(range(8, max_num_seqs, 8)) | {max_num_seqs})


def bucket_for(decodes: int, sizes: list[int]) -> int | None:
    """The smallest bucket that holds `decodes`; None past the largest."""
    index = bisect_left(sizes, decodes)
    return sizes[index] if index < len(sizes) else None


class StaticDecodeBatch:
    """A decode batch's input tensors for the largest bucket, kept for the graphs' lifetime (a
    graph reads the memory it was captured on); every row starts as padding. Host copies are
    pinned on CUDA, so that a step's inputs go over with asynchronous copies."""

    def __init__(self, max_size: int, max_blocks: int, scratch_block: int, block_size: int, device: torch.device):
        self.block_size = block_size
        self.padding_slot = scratch_block * block_size
        self.scratch_block = scratch_block
        self.device = torch.device(device)

        def staged(t: torch.Tensor) -> torch.Tensor:
            return t.pin_memory() if self.device.type == "cuda" else t

        self.host = {
            "input_ids": staged(torch.zeros(max_size, dtype=torch.long)),
            "positions": staged(torch.zeros(max_size, dtype=torch.long)),
            "slot_mapping": staged(torch.full((max_size,), self.padding_slot, dtype=torch.long)),
            "seq_lens": staged(torch.ones(max_size, dtype=torch.int32)),
            "block_tables": staged(torch.full((max_size, max_blocks), scratch_block, dtype=torch.int32)),
        }
        self.inputs = {name: t.to(self.device) for name, t in self.host.items()}
        # each row its own sequence of one token, each sampled: the same for every step
        self.query_start = torch.arange(max_size + 1, dtype=torch.int32, device=self.device)
        self.logits_rows = torch.arange(max_size, dtype=torch.long, device=self.device)

    def batch(self, size: int, sampled=()) -> ForwardBatch:
        """The first `size` rows as a ForwardBatch (what a graph of that size was captured on)."""
        i = self.inputs
        return ForwardBatch(
            input_ids=i["input_ids"][:size], positions=i["positions"][:size], slot_mapping=i["slot_mapping"][:size],
            query_start=self.query_start[: size + 1], seq_lens=i["seq_lens"][:size], block_tables=i["block_tables"][:size],
            logits_rows=self.logits_rows[:size], sampled=list(sampled), block_size=self.block_size,
        )

    def fill(self, host: HostBatch, size: int) -> ForwardBatch:
        """Write a decode step's rows into the first len(host.input_ids) rows, pad the rest up
        to `size`, and return the batch of `size` rows."""
        n, width = len(host.input_ids), host.block_tables.shape[1]
        stage = self.host  # free to rewrite: the previous step's copies were done once its sampled ids were read
        stage["input_ids"][:n] = torch.from_numpy(host.input_ids)
        stage["positions"][:n] = torch.from_numpy(host.positions)
        stage["slot_mapping"][:n] = torch.from_numpy(host.slot_mapping)
        stage["seq_lens"][:n] = torch.from_numpy(host.seq_lens)
        stage["block_tables"][:n, :width] = torch.from_numpy(np.ascontiguousarray(host.block_tables))
        stage["input_ids"][n:size] = 0
        stage["positions"][n:size] = 0
        stage["slot_mapping"][n:size] = self.padding_slot
        stage["seq_lens"][n:size] = 1
        stage["block_tables"][n:size, 0] = self.scratch_block
        for name in ("input_ids", "positions", "slot_mapping", "seq_lens"):
            self.inputs[name][:size].copy_(stage[name][:size], non_blocking=True)
        # only the columns this step's longest context uses (a padding row reads its first)
        self.inputs["block_tables"][:size, :width].copy_(stage["block_tables"][:size, :width], non_blocking=True)
        return self.batch(size, host.sampled)


class DecodeGraphs:
    """One captured forward pass per bucket, largest first, sharing one memory pool."""

    def __init__(self, model, kv: KVCache, static: StaticDecodeBatch, sizes: list[int]):
        self.static, self.sizes = static, sizes
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._logits: dict[int, torch.Tensor] = {}
        started = time.monotonic()
        size = None
        try:
            pool = torch.cuda.graph_pool_handle()
            with torch.inference_mode():
                for size in reversed(sizes):
                    self._capture(model, kv, size, pool)
        except Exception as exc:
            what = "the decode graphs" if size is None else f"the decode graph of batch size {size}"
            raise EngineConfigError(f"capturing {what} failed ({exc}); "
                                    "start the engine with --no-cuda-graphs to run every step eagerly") from exc
        log.info("captured decode graphs for batch sizes %s in %.1f s", sizes, time.monotonic() - started)

    def _capture(self, model, kv: KVCache, size: int, pool) -> None:
        batch = self.static.batch(size)
        model.forward(batch, kv)  # warm up: Triton compiles its kernels, the allocator settles
        torch.cuda.synchronize(self.static.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            self._logits[size] = model.forward(batch, kv)
        self._graphs[size] = graph

    def run(self, host: HostBatch) -> torch.Tensor | None:
        """Logits of a decode step [n, vocab] by replaying its bucket's graph; None when the
        step must run eagerly (a prefill slice, LoRA tokens, or more decodes than any bucket)."""
        size = bucket_for(len(host.input_ids), self.sizes)
        if size is None or not host.decodes_only or host.uses_lora:
            return None
        self.static.fill(host, size)
        self._graphs[size].replay()
        return self._logits[size][: len(host.input_ids)]
