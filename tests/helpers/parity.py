"""Comparing the engine's greedy tokens with transformers', allowing only genuine near-ties."""

from dataclasses import dataclass

import torch

NEAR_TIE_LOGPROB = 1e-3
REFERENCE_NEW_TOKENS = 32  # the shared greedy references' length (tests/conftest.py: smollm2_references)


@dataclass
class Reference:
    token_ids: list[int]
    logprobs: list[torch.Tensor]  # log-softmax over the vocabulary at each generated position


def greedy_reference(hf_model, prompt: list[int], new_tokens: int) -> Reference:
    """transformers' greedy continuation, step by step with its own KV cache, no EOS stop. The
    prefill computes the logits of its last position only, as transformers' own generate() does:
    the others are never read, and over a long prompt they cost a vocabulary-wide matmul a token."""
    tokens, logprobs = [], []
    with torch.inference_mode():
        out = hf_model(input_ids=torch.tensor([prompt]), use_cache=True, logits_to_keep=1)
        for _ in range(new_tokens):
            step_logprobs = out.logits[0, -1].float().log_softmax(-1)
            token = int(step_logprobs.argmax())
            tokens.append(token)
            logprobs.append(step_logprobs)
            out = hf_model(input_ids=torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
    return Reference(tokens, logprobs)


@dataclass
class Comparison:
    matched: int  # tokens equal before the first difference (all of them if none)
    near_tie: bool  # the sides differed at a genuine near-tie, and the comparison stopped there


def compare(engine_tokens: list[int], reference: Reference) -> Comparison:
    """Equal token ids, or a first difference that is a near-tie; anything else fails."""
    assert len(engine_tokens) == len(reference.token_ids), (engine_tokens, reference.token_ids)
    for i, (ours, theirs) in enumerate(zip(engine_tokens, reference.token_ids)):
        if ours == theirs:
            continue
        top2 = reference.logprobs[i].topk(2)
        gap = float(top2.values[0] - top2.values[1])
        assert set(top2.indices.tolist()) == {ours, theirs} and gap < NEAR_TIE_LOGPROB, (
            f"token {i}: engine chose {ours}, transformers {theirs}; reference top-2 {top2.indices.tolist()} "
            f"with logprob gap {gap:.2e} (a near-tie needs both in the top 2 within {NEAR_TIE_LOGPROB})"
        )
        return Comparison(i, True)
    return Comparison(len(engine_tokens), False)


def save_random_llama(folder, tokenizer, **overrides):
    """A random Llama with untied embeddings, written by transformers itself (safetensors)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1234)
    settings = dict(
        vocab_size=tokenizer.vocab_size, hidden_size=96, intermediate_size=256, num_hidden_layers=3,
        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=4096, rope_theta=50000.0,
        tie_word_embeddings=False, initializer_range=0.2,
    )
    model = LlamaForCausalLM(LlamaConfig(**(settings | overrides)))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(".bias"):  # transformers initialises biases to zero, which would test nothing
                parameter.normal_(0.0, 0.5)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save(folder)
    return folder
