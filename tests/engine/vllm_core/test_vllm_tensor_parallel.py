"""Tensor parallel on vLLM's CPU build: `k25 engine --backend vllm --tensor-parallel-size 2` (one
rank a CPU) and the same engine unsplit both give transformers' greedy tokens in float32 (the
near-tie rule of tests/helpers/parity.py), over K25's wire. The model has 4 heads of 64
(SmolLM2's 9 heads do not split in two)."""

import pytest
import torch

from tests.helpers.engine_process import dealer, generate_message, receive_until_done, send, start_engine
from tests.helpers.parity import compare, greedy_reference, save_random_llama
from tests.helpers.paths import VLLM_PYTHON
from tests.helpers.redis_server import module_redis_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

CHUNK = 64


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory, tiny_model):
    return save_random_llama(tmp_path_factory.mktemp("tp-llama"), tiny_model.tokenizer, hidden_size=256,
                             num_attention_heads=4, num_key_value_heads=2, intermediate_size=512)


def greedy_tokens(redis_url, folder, log, tensor_parallel: int, prompts) -> list[list[int]]:
    engine = start_engine(redis_url, str(log), "--backend", "vllm", "--enforce-eager", "--model", str(folder),
                          "--chunk-size", str(CHUNK), "--max-chunk-per-gpu", "8", "--cpu-threads", "2",
                          "--tensor-parallel-size", str(tensor_parallel), engine_id=f"tp{tensor_parallel}",
                          python=VLLM_PYTHON, timeout_s=300)
    try:
        socket = dealer(engine.address)
        answers = []
        for prompt in prompts:
            message = generate_message(prompt, CHUNK, max_tokens=16, ignore_eos=True)
            send(socket, message)
            replies = receive_until_done(socket, message.generate.request_id, timeout_s=120)
            assert replies[-1].WhichOneof("kind") == "final", replies[-1]
            answers.append([t for r in replies[:-1] for t in r.delta.token_ids])
        socket.close()
        return answers
    finally:
        assert engine.stop() == 0, engine.log()


def test_two_ranks_give_the_tokens_of_one(model_folder, module_redis_url, tmp_path, smollm2_prompts):  # noqa: F811
    assert VLLM_PYTHON.exists(), f"{VLLM_PYTHON} is missing: `make vllm` builds it"
    prompts = [p for p in smollm2_prompts if len(p) <= 300][:3]
    from transformers import LlamaForCausalLM

    reference_model = LlamaForCausalLM.from_pretrained(model_folder, dtype=torch.float32).eval()
    references = [greedy_reference(reference_model, p, 16) for p in prompts]
    for ranks in (1, 2):
        answers = greedy_tokens(module_redis_url, model_folder, tmp_path / f"tp{ranks}.log", ranks, prompts)
        near_ties = sum(compare(tokens, ref).near_tie for tokens, ref in zip(answers, references))
        assert near_ties <= 1, f"tensor parallel {ranks}"
