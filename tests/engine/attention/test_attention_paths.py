"""The engine's CPU attention, with the C++ decode kernel and with the torch path it falls back
to, and the batch layout both read, against the plain paged-attention reference evaluated in
float64 on the same inputs: one mixed batch of decodes of different context lengths, a first
prefill slice and a later slice over cached context, with block tables out of order."""

import pytest
import torch

from engine.attention.backend import CpuKernelAttention, choose_attention_backend
from engine.attention.torch_path import TorchAttention
from engine.attention.torch_reference import paged_attention_reference, rounding_bound
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence
from engine.runner.block_tables import BlockTables
from engine.runner.forward_batch import build_forward_batch

BLOCK = 16
KV_HEADS, GROUP, HEAD_DIM = 3, 3, 64
NUM_BLOCKS = 40


def make_batch(generator: torch.Generator):
    """(items, the shuffled block ids they own): (cached tokens, tokens this step) per sequence."""
    shapes = [(37, 1), (0, 20), (33, 15), (100, 1), (70, 1), (0, 1)]
    free = torch.randperm(NUM_BLOCKS, generator=generator).tolist()
    items = []
    for i, (cached, new) in enumerate(shapes):
        total = cached + new
        seq = Sequence(f"s{i}", list(range(1000, 1000 + total)), SamplingParams(max_tokens=4))
        seq.block_table = [free.pop() for _ in range(-(-total // BLOCK))]
        seq.num_computed_tokens = cached
        items.append((seq, new))
    return items


def test_a_cpu_with_the_kernels_built_attends_with_them():
    assert choose_attention_backend("cpu").name == "cpu-kernel", "the CPU kernels did not build"


@pytest.mark.parametrize("backend", [CpuKernelAttention, TorchAttention], ids=["kernel", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_attention_equals_the_reference_on_a_mixed_batch(dtype, backend):
    generator = torch.Generator().manual_seed(0)
    items = make_batch(generator)
    tables = BlockTables(len(items), NUM_BLOCKS)
    batch = build_forward_batch(items, tables, BLOCK, "cpu")
    tokens = sum(n for _, n in items)
    assert batch.query_start.tolist()[-1] == tokens and batch.seq_lens.tolist() == [c + n for c, n in
                                                                                    [(s.num_computed_tokens, n) for s, n in items]]

    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(dtype)

    k_cache, v_cache = randn(KV_HEADS, NUM_BLOCKS * BLOCK, HEAD_DIM), randn(KV_HEADS, NUM_BLOCKS * BLOCK, HEAD_DIM)
    q, k, v = randn(tokens, KV_HEADS * GROUP, HEAD_DIM), randn(tokens, KV_HEADS, HEAD_DIM), randn(tokens, KV_HEADS, HEAD_DIM)
    scale = HEAD_DIM**-0.5
    # the step's new K/V are in the cache before attention (engine/model/layer_ops.py writes them)
    k_cache.index_copy_(1, batch.slot_mapping, k.transpose(0, 1))
    v_cache.index_copy_(1, batch.slot_mapping, v.transpose(0, 1))
    ours = backend().forward(q, k_cache, v_cache, batch, scale)
    exact = paged_attention_reference(
        q.double(), k_cache.transpose(0, 1).double(), v_cache.transpose(0, 1).double(),
        batch.block_tables, batch.query_start, batch.seq_lens, BLOCK, scale,
    )
    # bfloat16 computes q.k and p.v in bf16 with float32 accumulation but rounds the scores and
    # the probabilities to bf16: the oracle's rounding_bound says how far that may go
    max_v = float(torch.cat([v_cache.abs().max().reshape(1), v.abs().max().reshape(1)]).max())
    max_score = float((q.double() @ k_cache.double().flatten(0, 1).T).abs().max()) * scale
    bound = rounding_bound(dtype, HEAD_DIM, int(batch.seq_lens.max()), max_score, max_v)
    error = (ours.double() - exact).abs().max().item()
    assert error <= bound, (error, bound)


def test_rows_are_reused_and_only_new_blocks_are_written():
    tables = BlockTables(max_rows=2, max_blocks_per_seq=8)
    first = tables.row_of("a", [5, 3])
    assert tables.table[first, :2].tolist() == [5, 3]
    assert tables.row_of("a", [5, 3, 7]) == first and tables.table[first, :3].tolist() == [5, 3, 7]
    second = tables.row_of("b", [1])
    assert second != first
    tables.remove("a")
    assert tables.row_of("c", [2, 4]) == first and tables.table[first, :2].tolist() == [2, 4]
