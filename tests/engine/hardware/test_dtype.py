"""The engine's dtype: how --dtype resolves, loading straight into it, and bf16 against the
fp32 transformers reference (teacher-forced, so one early difference cannot snowball)."""

import pytest
import torch

from engine.attention.kv_cache import KVCache
from engine.base.errors import EngineConfigError
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence
from engine.hardware.dtype_choice import bf16_path, choose_dtype, this_cpu_bf16_path
from engine.kernels.cpu_build import cpu_flags
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


@pytest.mark.parametrize("requested, device, expected", [
    ("float32", "cpu", "float32"), ("bfloat16", "cpu", "bfloat16"), ("float16", "cuda", "float16"),
    ("auto", "cuda", "bfloat16"), ("auto", "cuda:1", "bfloat16"), ("bfloat16", "cuda", "bfloat16"),
])
def test_a_set_dtype_is_kept_and_auto_on_cuda_is_bfloat16(requested, device, expected):
    for path in (None, "AVX2"):  # whatever the CPU
        assert choose_dtype(requested, device, path).name == expected


@pytest.mark.parametrize("flags, has_kernel, amx, path", [
    ({"avx2", "avx512f", "avx512_bf16", "amx_bf16"}, True, True, "AMX"),
    ({"avx2", "avx512f", "avx512_bf16"}, True, False, "AVX512-BF16"),
    ({"avx2", "fma"}, True, False, "AVX2"),
    ({"avx2", "avx512_bf16"}, False, False, None),  # the CPU kernels did not build: torch would emulate bf16
    ({"sse4_2"}, True, False, None),
])
def test_the_bf16_path_follows_the_cpus_instructions_and_the_built_kernel(flags, has_kernel, amx, path):
    assert bf16_path(flags, has_kernel, amx) == path


@pytest.mark.parametrize("path, expected", [("AMX", "bfloat16"), ("AVX512-BF16", "bfloat16"), ("AVX2", "bfloat16"), (None, "float32")])
def test_auto_on_a_cpu_is_decided_by_the_bf16_path_and_says_why(path, expected):
    choice = choose_dtype("auto", "cpu", path)
    assert choice.name == expected and choice.dtype == getattr(torch, expected)
    assert (path or "no bfloat16 projection kernel") in choice.reason


def test_auto_on_this_cpu_is_the_same_every_time():
    """No stopwatch: two resolutions on one machine cannot disagree (they did, near a timing margin)."""
    first = choose_dtype("auto", "cpu", this_cpu_bf16_path())
    assert all(choose_dtype("auto", "cpu", this_cpu_bf16_path()) == first for _ in range(3))
    assert bf16_path(cpu_flags(), True, False) == ("AVX512-BF16" if "avx512_bf16" in cpu_flags() else
                                                    "AVX2" if "avx2" in cpu_flags() else None)


@pytest.mark.parametrize("requested, device, fragment", [
    ("float16", "cpu", "only on CUDA"), ("int8", "cpu", "must be one of"), ("fp32", "cuda", "must be one of"),
])
def test_a_dtype_the_device_cannot_run_is_refused_with_a_clear_message(requested, device, fragment):
    with pytest.raises(EngineConfigError, match=fragment):
        choose_dtype(requested, device)


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
