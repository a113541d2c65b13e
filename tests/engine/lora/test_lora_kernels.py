"""The Triton shrink/expand kernels against the torch path and against the plain formula
x @ A.T @ B.T * scaling per token, on small shapes. On a CPU they run under TRITON_INTERPRET=1."""

import pytest
import torch

from engine.base.model_config import ModelConfig
from engine.lora.adapter import BASE_SLOT, AdapterWeights
from engine.lora.batch import KERNEL_BLOCK_ROWS, build_lora_batch
from engine.lora.layout import projections
from engine.lora.slots import LoRASlots
from tests.helpers.triton_on_cpu import DEVICE, interpret_on_a_cpu  # noqa: F401 (an autouse fixture)

# a GQA model small enough for the interpreter: q 32, k/v 16, MLP 48
CONFIG = ModelConfig(
    vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2,
    head_dim=8, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=128, tie_word_embeddings=False,
)
MAX_RANK = 8
# slot 0: rank 8 on every module; slot 1: rank 3 on k and down only; slot 2 stays empty
ADAPTER_MODULES = [
    (8, 2.0, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
    (3, 0.5, ("k_proj", "down_proj")),
]


def random_adapter(rank: int, scaling: float, modules, generator) -> AdapterWeights:
    shapes = {m: (size, p.in_features) for p in projections(CONFIG) for m, size in zip(p.modules, p.slice_sizes)}
    matrices = {
        (layer, m): (torch.randn(rank, shapes[m][1], generator=generator), torch.randn(shapes[m][0], rank, generator=generator))
        for layer in range(CONFIG.num_layers)
        for m in modules
    }
    return AdapterWeights(rank=rank, scaling=scaling, matrices=matrices)


@pytest.fixture(scope="module")
def adapters():
    generator = torch.Generator().manual_seed(0)
    return [random_adapter(r, s, modules, generator) for r, s, modules in ADAPTER_MODULES]


def filled_slots(adapters, kernel: str) -> LoRASlots:
    slots = LoRASlots(CONFIG, 3, MAX_RANK, DEVICE, torch.float32, kernel)
    for slot, adapter in enumerate(adapters):
        slots.write(slot, adapter)
    return slots


def formula_delta(adapters, token_slots, x, layer, projection) -> torch.Tensor:
    """Per token, per slice: x @ A.T @ B.T * scaling, from the adapter's own matrices."""
    delta = torch.zeros(x.shape[0], projection.out_features)
    offsets = projection.slice_offsets
    for t, slot in enumerate(token_slots):
        if slot == BASE_SLOT or slot >= len(adapters):
            continue
        adapter = adapters[slot]
        for i, module in enumerate(projection.modules):
            if (layer, module) in adapter.matrices:
                a, b = adapter.matrices[(layer, module)]
                delta[t, offsets[i] : offsets[i + 1]] = (x[t].cpu() @ a.T @ b.T) * adapter.scaling
    return delta


def summation_bound(adapters, token_slots, x, layer, projection) -> torch.Tensor:
    """How far two float32 evaluations of x @ A.T @ B.T * scaling may differ per element when
    they add in different orders: each has forward error at most gamma_n * (|x| @ |A|.T @ |B|.T)
    * scaling, with n = in_features + rank terms summed (Higham, Accuracy and Stability, 3.1)."""
    absolute = [
        AdapterWeights(a.rank, abs(a.scaling), {k: (m[0].abs(), m[1].abs()) for k, m in a.matrices.items()})
        for a in adapters
    ]
    terms = projection.in_features + MAX_RANK
    unit_roundoff = torch.finfo(torch.float32).eps / 2
    gamma = terms * unit_roundoff / (1 - terms * unit_roundoff)
    return 2 * gamma * formula_delta(absolute, token_slots, x.abs(), layer, projection)


def assert_within_summation_noise(actual, expected, bound) -> None:
    excess = (actual.cpu() - expected.cpu()).abs() - bound
    assert excess.max() <= 0, f"off by more than float32 summation noise: worst excess {excess.max():.3g}"


# mixed and unsorted: the base model, both adapters, and tokens of one slot apart from each other
TOKEN_SLOTS = [0, BASE_SLOT, 1, 0, BASE_SLOT, 1, 1, 0]


@pytest.mark.parametrize("kernel", ["torch", "triton"])
@pytest.mark.parametrize("projection", ["qkv", "o", "gate_up", "down"])
def test_delta_matches_the_formula(adapters, kernel, projection):
    slots = filled_slots(adapters, kernel)
    proj = slots.projections[projection]
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(len(TOKEN_SLOTS), proj.in_features, generator=generator).to(DEVICE)
    base = torch.randn(len(TOKEN_SLOTS), proj.out_features, generator=generator).to(DEVICE)
    for layer in range(CONFIG.num_layers):
        out = base.clone()
        slots.add_delta(layer, projection, x, out, build_lora_batch(TOKEN_SLOTS, DEVICE))
        expected = base.cpu() + formula_delta(adapters, TOKEN_SLOTS, x, layer, proj)
        # one more rounding: the delta is added onto base
        bound = summation_bound(adapters, TOKEN_SLOTS, x, layer, proj) + expected.abs() * torch.finfo(torch.float32).eps
        assert_within_summation_noise(out, expected, bound)
        base_rows = [t for t, s in enumerate(TOKEN_SLOTS) if s == BASE_SLOT]
        assert torch.equal(out[base_rows], base[base_rows]), "base-model tokens must be left untouched"


def test_triton_and_torch_paths_agree_on_every_projection(adapters):
    torch_slots, triton_slots = filled_slots(adapters, "torch"), filled_slots(adapters, "triton")
    token_slots = [1] * 18 + [0, BASE_SLOT] * 5 + [1]  # slot 1 spans two kernel blocks
    batch = build_lora_batch(token_slots, DEVICE)
    generator = torch.Generator().manual_seed(2)
    for name, proj in torch_slots.projections.items():
        x = torch.randn(len(token_slots), proj.in_features, generator=generator).to(DEVICE)
        by_torch = torch.zeros(len(token_slots), proj.out_features, device=DEVICE)
        by_triton = by_torch.clone()
        torch_slots.add_delta(1, name, x, by_torch, batch)
        triton_slots.add_delta(1, name, x, by_triton, batch)
        assert_within_summation_noise(by_triton, by_torch, summation_bound(adapters, token_slots, x, 1, proj))
        assert by_torch.abs().sum() > 0


def test_rewriting_a_slot_replaces_the_old_adapter_entirely(adapters):
    slots = filled_slots(adapters, "torch")
    slots.write(0, adapters[1])  # rank 3 on k and down only, over the rank-8 all-module adapter
    x = torch.randn(2, CONFIG.hidden_size).to(DEVICE)
    out = torch.zeros(2, slots.projections["gate_up"].out_features, device=DEVICE)
    slots.add_delta(0, "gate_up", x, out, build_lora_batch([0, 0], DEVICE))
    assert torch.count_nonzero(out) == 0, "slot 0's old gate/up matrices must be gone"


def test_tokens_are_grouped_by_slot_and_cut_into_kernel_blocks():
    token_slots = [1] * (KERNEL_BLOCK_ROWS + 2) + [BASE_SLOT, 0, 0]
    batch = build_lora_batch(token_slots, "cpu")
    assert [(slot, rows.tolist()) for slot, rows in batch.groups] == [(0, [19, 20]), (1, list(range(18)))]
    assert batch.rows.tolist() == [19, 20, *range(18)]
    assert batch.block_slot.tolist() == [0, 1, 1]
    assert batch.block_start.tolist() == [0, 2, 2 + KERNEL_BLOCK_ROWS]
    assert batch.block_rows.tolist() == [2, KERNEL_BLOCK_ROWS, 2]


def test_a_batch_of_base_tokens_only_has_no_lora_batch():
    assert build_lora_batch([BASE_SLOT] * 4, DEVICE) is None
