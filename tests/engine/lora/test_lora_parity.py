"""Greedy parity with transformers + peft for one batch that mixes three adapters and the base
model: the adapters are random (B non-zero) and written by peft itself, the references come
from the same peft model, one adapter active at a time (tests/parity.py's near-tie rule)."""

import pytest
import torch

from common.tokenizer import load_tokenizer
from engine.base.config import EngineConfig
from engine.core.sampling_params import SamplingParams
from engine.llm_engine import LLMEngine
from engine.model.loader import load_model
from tests.fixtures.parity_prompts import parity_prompt_ids
from tests.helpers.lora_helpers import (
    MIXED_SPECS,
    attach_random_adapters,
    peft_references,
    run_mixed,
    save_tiny_llama_with_adapters,
)
from tests.helpers.parity import compare

NEW_TOKENS = 12
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
VARIANTS = [None, *MIXED_SPECS]  # the base model and the three adapters


@pytest.fixture(scope="module")
def prompts():
    """Three short prompts (1-18 tokens) and one of 370 tokens, prefilled in chunks of 64."""
    ids = parity_prompt_ids(load_tokenizer("smollm2-135m"))
    return [p for p in ids if len(p) < 300][:3] + [next(p for p in ids if 300 < len(p) < 600)]


def check_mixed_batch(engine, prompts, references, label, parity_report):
    for name in MIXED_SPECS:
        engine.load_adapter(name, "v1", name)
    jobs = [(prompt, name) for prompt in prompts for name in VARIANTS]
    outputs = run_mixed(engine, jobs, GREEDY)
    comparisons = []
    for (prompt, name), out in zip(jobs, outputs):
        assert out.finish_reason.value == "length", out.last.error
        comparisons.append(compare(out.token_ids, references[name][prompts.index(prompt)]))
    for i, prompt in enumerate(prompts):
        base = references[None][i].token_ids
        for name in MIXED_SPECS:
            assert references[name][i].token_ids != base, f"adapter {name} does not change the output: a weak test"
    near_ties = sum(c.near_tie for c in comparisons)
    parity_report.append(
        f"LoRA {label}: {len(jobs)} requests ({len(prompts)} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} "
        f"tokens x base + 3 adapters, one batch), {sum(c.matched for c in comparisons)} tokens equal to transformers+peft, "
        f"{near_ties} stopped at a near-tie, {engine.num_preemptions} preemptions"
    )
    assert near_ties <= 2
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory, tiny_model, prompts):
    folder, root = tmp_path_factory.mktemp("tiny-llama"), tmp_path_factory.mktemp("adapters")
    peft_model = save_tiny_llama_with_adapters(folder, root, tiny_model.tokenizer)
    return folder, root, peft_references(peft_model, prompts, NEW_TOKENS)


# (label, max_loras, max_cpu_loras, kernel, max_chunk_per_gpu): every adapter in a slot; fewer slots
# than adapters, so some requests wait for a slot and adapters are re-read from disk after leaving
# the CPU cache; a KV cache so small that requests are preempted and recomputed; the Triton kernels
# (interpreted on a CPU). 32 chunks hold the whole batch at once (at most 120 blocks of 16), so
# only the preemptions mode preempts, whatever order the scheduler admits in.
TINY_MODES = [
    pytest.param("3 slots", 3, 3, "torch", 32, id="3 slots"),
    pytest.param("2 slots, CPU cache 2", 2, 2, "torch", 32, id="2 slots"),
    pytest.param("1 slot, CPU cache 1", 1, 1, "torch", 32, id="1 slot"),
    pytest.param("2 slots, KV for 384 tokens (preemptions)", 2, 2, "torch", 6, id="preemptions"),
    pytest.param("3 slots, Triton kernels", 3, 3, "triton", 32, id="triton", marks=pytest.mark.slow),  # ~10 s interpreted
]


@pytest.mark.parametrize("label, max_loras, max_cpu_loras, kernel, max_chunks", TINY_MODES)
def test_tiny_mixed_batch_matches_peft(tiny_setup, prompts, label, max_loras, max_cpu_loras, kernel, max_chunks, parity_report, monkeypatch):
    folder, root, references = tiny_setup
    if kernel == "triton" and not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")  # read when the kernels are first imported
    config = EngineConfig(
        chunk_size=64, max_chunk_per_gpu=max_chunks, max_num_batched_tokens=64, max_loras=max_loras,
        max_cpu_loras=max_cpu_loras, max_lora_rank=16, adapter_root=str(root), lora_kernel=kernel,
    )
    engine = LLMEngine(load_model(str(folder)), config)
    used = prompts if kernel == "torch" else prompts[:3]  # the interpreter would take minutes over 370 tokens
    check_mixed_batch(engine, used, references, f"tiny HF folder, {label}", parity_report)
    assert engine.runner.adapters.slot_writes >= len(MIXED_SPECS), "every adapter went through a slot, some through a reused one"
    assert (engine.num_preemptions > 0) == (max_chunks == 6), engine.num_preemptions
    if max_cpu_loras == 1:
        assert engine.runner.adapters.disk_reads > len(MIXED_SPECS), "evicted adapters are read again from disk"


@pytest.mark.slow
def test_smollm2_mixed_batch_matches_peft(hf_smollm2, smollm2, prompts, tmp_path, parity_report):
    import copy

    peft_model = attach_random_adapters(copy.deepcopy(hf_smollm2), MIXED_SPECS)  # the session's model stays bare
    peft_model.save_pretrained(tmp_path)
    references = peft_references(peft_model, prompts, NEW_TOKENS)
    del peft_model
    config = EngineConfig(
        chunk_size=64, max_chunk_per_gpu=16, max_num_batched_tokens=64, max_loras=2, max_lora_rank=16, adapter_root=str(tmp_path)
    )
    check_mixed_batch(LLMEngine(smollm2, config), prompts, references, "SmolLM2, 2 slots", parity_report)
