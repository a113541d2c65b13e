"""LoRA test helpers: random adapters written by peft itself, and runs of the engine that
mix adapters and the base model in one batch."""

import hashlib

import torch

from engine.core.sampling_params import SamplingParams
from engine.llm_engine import LLMEngine
from engine.lora.adapter import AdapterRef
from engine.offline import Completion, collect, make_request
from proto import k25_pb2
from tests.helpers.engine_process import generate_message
from tests.helpers.parity import greedy_reference

ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# three adapters that differ in rank, targets and scaling (one rsLoRA). Names must not occur in
# module paths: peft 0.21 saves an adapter named e.g. "all" without the modules under ".mlp."
# when another adapter is named "mlp".
MIXED_SPECS = {
    "legal": dict(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
    "chat": dict(r=16, lora_alpha=8, use_rslora=True, target_modules=["gate_proj", "up_proj", "down_proj"]),
    "code": dict(r=4, lora_alpha=4, target_modules=ALL_MODULES),
}


def attach_random_adapters(hf_model, specs: dict[str, dict], seed: int = 0):
    """`hf_model` (changed in place) wrapped by peft with one adapter per spec. init_lora_weights=False
    gives B random values too: PEFT's default B = 0 would make every adapter a no-op."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    (first, *rest) = specs
    peft_model = get_peft_model(hf_model, LoraConfig(init_lora_weights=False, **specs[first]), adapter_name=first)
    for name in rest:
        peft_model.add_adapter(name, LoraConfig(init_lora_weights=False, **specs[name]))
    return peft_model.eval()


def save_tiny_llama_with_adapters(model_dir, adapter_root, tokenizer, specs: dict[str, dict] = MIXED_SPECS,
                                  **model_overrides):
    """A random Llama saved by transformers in model_dir (save_random_llama's shape, with
    `model_overrides`), and adapter_root/<name>/ (PEFT files) for each spec; returns the peft
    model that wrote them (for references)."""
    from transformers import LlamaForCausalLM

    from tests.helpers.parity import save_random_llama

    save_random_llama(model_dir, tokenizer, **model_overrides)
    hf_model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    peft_model = attach_random_adapters(hf_model, specs)
    peft_model.save_pretrained(adapter_root)
    return peft_model


def peft_references(peft_model, prompts: list[list[int]], new_tokens: int) -> dict:
    """Greedy references per adapter name, and under None with every adapter disabled."""
    references = {}
    for name in peft_model.peft_config:
        peft_model.set_adapter(name)
        references[name] = [greedy_reference(peft_model, p, new_tokens) for p in prompts]
    with peft_model.disable_adapter():
        references[None] = [greedy_reference(peft_model, p, new_tokens) for p in prompts]
    return references


def run_mixed(
    engine: LLMEngine, jobs: list[tuple[list[int], str | None]], sampling: SamplingParams, version: str = "v1"
) -> list[Completion]:
    """Submit every (prompt, adapter name or None) at once and step until all have finished."""
    requests = []
    for prompt, name in jobs:
        request = make_request(engine, prompt, sampling)
        request.adapter = AdapterRef(name, version) if name else None
        requests.append(request)
    completions = {r.request_id: Completion(r.request_id) for r in requests}
    for request in requests:
        engine.add_request(request)
    while engine.has_unfinished():
        collect(completions, engine.step().outputs)
    return [completions[r.request_id] for r in requests]


def checksum(folder) -> str:
    """The engine's definition: sha256 of the config bytes, then the weights bytes."""
    digest = hashlib.sha256()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        digest.update((folder / name).read_bytes())
    return digest.hexdigest()


def adapter_request(prompt, adapter: str | None, version="v1", chunk_size: int = 32, **sampling) -> k25_pb2.ClientMessage:
    """A generate message for `adapter@version` (the base model when adapter is None), 8 tokens unless told."""
    message = generate_message(prompt, chunk_size, max_tokens=sampling.pop("max_tokens", 8), ignore_eos=True, **sampling)
    if adapter:
        message.generate.adapter.name, message.generate.adapter.version = adapter, version
    return message
