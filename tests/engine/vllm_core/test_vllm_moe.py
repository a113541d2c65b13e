"""A mixture-of-experts model, which K25's own engine does not serve, through the vLLM backend:
a tiny random Mixtral written by transformers (4 experts, 2 per token), greedy token for token
against transformers in float32, over K25's wire."""

import pytest
import torch

from tests.helpers.engine_process import dealer, generate_message, receive, send, start_engine
from tests.helpers.parity import compare, greedy_reference
from tests.helpers.paths import VLLM_PYTHON
from tests.helpers.redis_server import module_redis_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

CHUNK = 64
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def mixtral_folder(tmp_path_factory, tiny_model):
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(7)
    config = MixtralConfig(
        vocab_size=tiny_model.tokenizer.vocab_size, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=64, num_local_experts=4, num_experts_per_tok=2,
        max_position_embeddings=2048, tie_word_embeddings=False, initializer_range=0.2,
    )
    folder = tmp_path_factory.mktemp("tiny-mixtral")
    MixtralForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    tiny_model.tokenizer.save(str(folder))
    return folder


@pytest.fixture(scope="module")
def engine(mixtral_folder, tmp_path_factory, module_redis_url):  # noqa: F811
    assert VLLM_PYTHON.exists(), f"{VLLM_PYTHON} is missing: `make vllm` builds it"
    log = tmp_path_factory.mktemp("moe-engine") / "engine.log"
    process = start_engine(module_redis_url, str(log), "--backend", "vllm", "--enforce-eager", "--model",
                           str(mixtral_folder), "--chunk-size", str(CHUNK), "--max-chunk-per-gpu", "8",
                           python=VLLM_PYTHON, timeout_s=300)
    yield process
    assert process.stop() == 0, process.log()


def test_greedy_tokens_match_transformers(engine, mixtral_folder, smollm2_prompts, parity_report):
    from transformers import MixtralForCausalLM

    reference_model = MixtralForCausalLM.from_pretrained(mixtral_folder, dtype=torch.float32).eval()
    prompts = [p for p in smollm2_prompts if len(p) + NEW_TOKENS <= 8 * CHUNK][:6]
    references = [greedy_reference(reference_model, p, NEW_TOKENS) for p in prompts]
    socket = dealer(engine.address)
    requests = [generate_message(p, CHUNK, max_tokens=NEW_TOKENS, ignore_eos=True) for p in prompts]
    for message in requests:
        send(socket, message)
    tokens = {m.generate.request_id: [] for m in requests}
    done = 0
    while done < len(requests):
        message = receive(socket, timeout_s=120)
        assert message.WhichOneof("kind") != "error", message
        if message.HasField("delta"):
            tokens[message.delta.request_id] += message.delta.token_ids
        done += message.HasField("final")
    comparisons = [compare(tokens[m.generate.request_id], ref) for m, ref in zip(requests, references)]
    parity_report.append(f"tiny random Mixtral on backend vllm: {len(prompts)} prompts, "
                         f"{sum(c.matched for c in comparisons)} tokens equal, {sum(c.near_tie for c in comparisons)} near-ties")
    assert sum(c.near_tie for c in comparisons) <= 1
