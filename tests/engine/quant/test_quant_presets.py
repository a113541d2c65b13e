"""The presets on SmolLM2: each one's mean KL against the unquantised bf16 model, teacher-forced
over the parity prompts, stays within the budget the preset states (common/quant_spec.py), fed
in slices that run the weight-only kernels (64 rows) and the dequantise-then-bf16 path."""

import pytest
import torch

from bench.quant_kl import divergence, teacher_forced_logprobs
from common.quant_spec import NO_QUANT, PRESETS, parse_quant_spec
from engine.model.llama import LlamaModel
from engine.quant.kernel_choice import DEQUANTIZE_FROM
from tests.fixtures.parity_prompts import parity_prompt_ids

pytestmark = pytest.mark.slow  # loads SmolLM2 and runs it once per preset and slice size

PROMPT_TOKENS = 200  # each parity prompt cut to this many tokens
KERNEL_SLICE = 64  # rows below every width's DEQUANTIZE_FROM: the weight-only kernels
DEQUANTIZE_SLICE = PROMPT_TOKENS  # the long prompts' one slice is past every threshold


@pytest.fixture(scope="module")
def prompts(smollm2):
    assert KERNEL_SLICE < min(DEQUANTIZE_FROM.values()) and DEQUANTIZE_SLICE >= max(DEQUANTIZE_FROM.values())
    return [p[:PROMPT_TOKENS] for p in parity_prompt_ids(smollm2.tokenizer)]


@pytest.fixture(scope="module")
def reference(smollm2, prompts):
    """The unquantised bf16 model's log-probabilities, one list per slice size."""
    model = LlamaModel(smollm2.config, smollm2.weights, "cpu", torch.bfloat16, quant=NO_QUANT)
    return {size: [teacher_forced_logprobs(model, p, size) for p in prompts] for size in (KERNEL_SLICE, DEQUANTIZE_SLICE)}


@pytest.fixture(scope="module")
def preset_models(smollm2):
    return {name: LlamaModel(smollm2.config, smollm2.weights, "cpu", torch.bfloat16, quant=parse_quant_spec(name))
            for name in PRESETS if name != "none"}


@pytest.mark.parametrize("size", [KERNEL_SLICE, DEQUANTIZE_SLICE], ids=["kernels", "dequantised"])
@pytest.mark.parametrize("name", [n for n in PRESETS if n != "none"])
def test_each_preset_stays_within_its_kl_budget(name, size, prompts, reference, preset_models, parity_report):
    candidate = [teacher_forced_logprobs(preset_models[name], p, size) for p in prompts]
    d = divergence(reference[size], candidate, prompts)
    parity_report.append(f"SmolLM2 --quant {name} vs bf16, teacher-forced ({size}-token slices) over {d.positions} "
                         f"positions: mean KL {d.mean_kl:.4f} nats (budget {PRESETS[name].kl_budget}), "
                         f"top-1 agreement {d.top1_agreement:.3f}")
    assert d.mean_kl <= PRESETS[name].kl_budget
