"""The engine's dtype: how --dtype resolves, loading straight into it, and bf16 against the
fp32 transformers reference (teacher-forced, so one early difference cannot snowball)."""

import math

import pytest
import torch

from engine.attention.kv_cache import KVCache
from engine.base.errors import EngineConfigError
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence
from engine.hardware.dtype_choice import choose_dtype, faster_dtype, matmul_seconds
from engine.model.llama import LlamaModel
from engine.model.loader import TINY_CONFIG, load_model, model_config
from engine.runner.block_tables import BlockTables
from engine.runner.forward_batch import build_forward_batch
from tests.fixtures.parity_prompts import parity_prompt_ids

# each parity prompt is cut to this many tokens: bf16 matmuls are emulated on CPUs without
# AVX512-BF16, and positions past it add cost but no new kind of context
TEACHER_FORCED_TOKENS = 160
MIN_TOP1_AGREEMENT = 0.98
MAX_MEAN_KL_NATS = 0.02


def never_measured(name):
    raise AssertionError("measured although the choice needs no measurement")


@pytest.mark.parametrize("requested, device, expected", [
    ("float32", "cpu", "float32"), ("bfloat16", "cpu", "bfloat16"), ("float16", "cuda", "float16"),
    ("auto", "cuda", "bfloat16"), ("auto", "cuda:1", "bfloat16"), ("bfloat16", "cuda", "bfloat16"),
])
def test_a_set_dtype_or_cuda_needs_no_measurement(requested, device, expected):
    assert choose_dtype(requested, device, never_measured).name == expected


@pytest.mark.parametrize("seconds, expected", [
    ({"float32": (2.0, 2.0), "bfloat16": (1.0, 1.0)}, "bfloat16"),
    ({"float32": (1.0, 1.0), "bfloat16": (3.0, 3.0)}, "float32"),
    ({"float32": (1.0, 1.0), "bfloat16": (1.0, 1.0)}, "float32"),  # a tie goes to the exact one
    ({"float32": (1.15, 1.15), "bfloat16": (1.0, 1.0)}, "float32"),  # ... and so does a lead within the noise (MARGIN)
    ({"float32": (1.2, 1.2), "bfloat16": (1.0, 1.0)}, "bfloat16"),
    # an AVX2-only CPU: half the bytes at batch 1, a tie at a full batch: geometric mean 1.39
    ({"float32": (0.18, 2.0), "bfloat16": (0.09, 2.1)}, "bfloat16"),
    # a 2x gain at one batch size cancels a 2x loss at the other
    ({"float32": (2.0, 1.0), "bfloat16": (1.0, 2.0)}, "float32"),
    # summed, the full batch would decide alone; in the geometric mean a 4% loss there does not
    ({"float32": (0.2, 10.0), "bfloat16": (0.1, 10.4)}, "bfloat16"),
])
def test_auto_on_a_cpu_takes_the_faster_measured_dtype(seconds, expected):
    assert faster_dtype(seconds) == expected
    choice = choose_dtype("auto", "cpu", seconds.__getitem__)
    assert choice.name == expected and choice.dtype == getattr(torch, expected)
    assert "float32" in choice.reason and "bfloat16" in choice.reason  # the log says what was measured


@pytest.mark.parametrize("requested, device, fragment", [
    ("float16", "cpu", "only on CUDA"), ("int8", "cpu", "must be one of"), ("fp32", "cuda", "must be one of"),
])
def test_a_dtype_the_device_cannot_run_is_refused_with_a_clear_message(requested, device, fragment):
    with pytest.raises(EngineConfigError, match=fragment):
        choose_dtype(requested, device, never_measured)


def test_the_measurement_runs_the_models_matmul_in_both_dtypes():
    measure = matmul_seconds(TINY_CONFIG, (1, 4), repeats=2)
    for name in ("float32", "bfloat16"):
        times = measure(name)
        assert len(times) == 2 and all(math.isfinite(t) and t > 0 for t in times)


def test_weights_load_straight_into_the_target_dtype():
    model = load_model("tiny-random", torch.bfloat16)
    assert {t.dtype for t in model.weights.values()} == {torch.bfloat16}
    fp32 = load_model("tiny-random")
    for name, tensor in model.weights.items():
        assert torch.equal(tensor, fp32.weights[name].to(torch.bfloat16)), name


def test_the_config_is_read_without_the_weights(smollm2_gguf, smollm2):
    assert model_config(smollm2_gguf) == smollm2.config
    assert model_config("tiny-random") == TINY_CONFIG


BLOCK_SIZE = 16
# the steps a teacher-forced sequence is fed in: a first prefill slice, a later slice over
# cached context, then one token at a time, so that every attention path is measured
SLICES = (64, 40)


def teacher_forced_logprobs(model: LlamaModel, tokens: list[int], dtype) -> torch.Tensor:
    """Log-softmax of the next token at every position, through the engine's own forward pass
    and paged KV cache: the sequence is fed as SLICES, then decoded one known token at a time."""
    n = len(tokens)
    blocks = -(-n // BLOCK_SIZE)
    kv = KVCache(model.config, blocks * BLOCK_SIZE, "cpu", dtype)
    seq = Sequence("teacher-forced", tokens, SamplingParams(max_tokens=1), block_table=list(range(blocks))[::-1])
    tables = BlockTables(1, blocks)
    steps, fed = [], 0
    for size in SLICES:
        if fed + size < n:
            steps.append(size)
            fed += size
    steps += [1] * (n - fed)
    out = []
    with torch.inference_mode():
        for size in steps:
            batch = build_forward_batch([(seq, size)], tables, BLOCK_SIZE, "cpu")
            batch.logits_rows = torch.arange(size)  # every position, not only the last
            out.append(model.forward(batch, kv).log_softmax(-1))
            seq.num_computed_tokens += size
    return torch.cat(out)


@pytest.mark.slow
def test_bf16_agrees_with_the_fp32_reference_teacher_forced(smollm2, hf_smollm2, parity_report):
    ours = LlamaModel(smollm2.config, smollm2.weights, "cpu", torch.bfloat16)
    agree = positions = 0
    kl_sum = 0.0
    for prompt in parity_prompt_ids(smollm2.tokenizer):
        tokens = prompt[:TEACHER_FORCED_TOKENS]
        with torch.inference_mode():
            reference = hf_smollm2(input_ids=torch.tensor([tokens])).logits[0].float().log_softmax(-1)
        candidate = teacher_forced_logprobs(ours, tokens, torch.bfloat16)
        agree += int((candidate.argmax(-1) == reference.argmax(-1)).sum())
        # KL(reference || bf16) per position, in nats
        kl_sum += float((reference.exp() * (reference - candidate)).sum(-1).sum())
        positions += len(tokens)
    top1, mean_kl = agree / positions, kl_sum / positions
    parity_report.append(f"SmolLM2 bf16 vs fp32 transformers, teacher-forced over {positions} positions: "
                         f"top-1 agreement {top1:.4f}, mean KL {mean_kl:.4f} nats")
    assert top1 >= MIN_TOP1_AGREEMENT and mean_kl <= MAX_MEAN_KL_NATS
