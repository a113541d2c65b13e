"""Load time of a rank-16 SmolLM2 adapter (all seven projections) from local disk; the figure
is printed (`-s`) and goes into README.md. The target is under 200 ms; the assertion only
guards against a gross regression on a shared CI machine."""

import statistics

import pytest
import torch

from bench.lora_bench import adapter_load_times
from engine.base.config import EngineConfig
from engine.llm_engine import LLMEngine
from tests.helpers.lora_helpers import ALL_MODULES, attach_random_adapters


@pytest.mark.slow
def test_a_rank_16_smollm2_adapter_loads_quickly(smollm2, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    c = smollm2.config
    with torch.device("meta"):  # only the shapes matter: no time spent initialising 135M weights
        shaped_like_smollm2 = LlamaForCausalLM(
            LlamaConfig(
                vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
                head_dim=c.head_dim, tie_word_embeddings=c.tie_word_embeddings,
            )
        )
    shaped_like_smollm2 = shaped_like_smollm2.to_empty(device="cpu")
    attach_random_adapters(shaped_like_smollm2, {"r16": dict(r=16, lora_alpha=32, target_modules=ALL_MODULES)}).save_pretrained(tmp_path)
    size_mb = (tmp_path / "r16" / "adapter_model.safetensors").stat().st_size / 1e6
    engine = LLMEngine(smollm2, EngineConfig(chunk_size=64, max_chunk_per_gpu=4, max_loras=1, max_lora_rank=16, adapter_root=str(tmp_path)))
    times = adapter_load_times(engine, "r16")
    print(f"\nSmolLM2 rank-16 adapter ({size_mb:.1f} MB, 7 projections x {c.num_layers} layers): {times.summary()}")
    assert statistics.median(times.load_s) < 1.0
    assert engine.adapter_keys == []
