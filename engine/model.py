"""The Llama-family forward pass (Llama, Qwen2-style GQA, SmolLM), written for paged KV.

RMSNorm -> attention (RoPE, GQA) -> residual -> RMSNorm -> SwiGLU MLP -> residual, per
layer; final norm and the LM head run only on rows whose next token is sampled."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.attention import paged_attention
from engine.base.model_config import ModelConfig
from engine.forward_batch import ForwardBatch
from engine.kv_cache import KVCache
from engine.lora.slots import LoRASlots
from engine.rope import RotaryEmbedding, apply_rotary


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalised in fp32 whatever the activation dtype, then scaled (as Hugging Face's LlamaRMSNorm)."""
    return weight * F.rms_norm(x.float(), x.shape[-1:], eps=eps).to(x.dtype)


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: torch.Tensor  # q, k and v projections stacked: one matmul
    qkv_bias: torch.Tensor | None  # Qwen2 has attention biases, Llama does not
    o: torch.Tensor
    o_bias: torch.Tensor | None
    post_attention_norm: torch.Tensor
    gate_up: torch.Tensor  # gate and up projections stacked
    down: torch.Tensor


class LlamaModel:
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], device, dtype: torch.dtype, lora: LoRASlots | None = None):
        self.config = config
        self.lora = lora  # adapters' deltas, added to the projections of tokens that use one

        def w(name: str) -> torch.Tensor:
            return weights[name].to(device=device, dtype=dtype)

        self.embed_tokens = w("model.embed_tokens.weight")
        self.layers = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            self.layers.append(
                LayerWeights(
                    input_norm=w(p + "input_layernorm.weight"),
                    qkv=torch.cat([w(p + f"self_attn.{n}_proj.weight") for n in "qkv"]).contiguous(),
                    qkv_bias=(
                        torch.cat([w(p + f"self_attn.{n}_proj.bias") for n in "qkv"])
                        if p + "self_attn.q_proj.bias" in weights
                        else None
                    ),
                    o=w(p + "self_attn.o_proj.weight"),
                    o_bias=w(p + "self_attn.o_proj.bias") if p + "self_attn.o_proj.bias" in weights else None,
                    post_attention_norm=w(p + "post_attention_layernorm.weight"),
                    gate_up=torch.cat([w(p + "mlp.gate_proj.weight"), w(p + "mlp.up_proj.weight")]).contiguous(),
                    down=w(p + "mlp.down_proj.weight"),
                )
            )
        self.norm = w("model.norm.weight")
        self.lm_head = self.embed_tokens if config.tie_word_embeddings else w("lm_head.weight")
        self.rope = RotaryEmbedding(
            config.head_dim, config.max_position_embeddings, config.rope_theta, config.rope_scaling, device, dtype
        )
        self.weight_bytes = sum(
            t.numel() * t.element_size()
            for t in [self.embed_tokens, self.norm, *([] if config.tie_word_embeddings else [self.lm_head])]
        ) + sum(t.numel() * t.element_size() for layer in self.layers for t in vars(layer).values() if t is not None)

    def forward(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        """Logits [len(batch.logits_rows), vocab] for the rows that are sampled."""
        c = self.config
        q_size, kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        cos, sin = self.rope.tables(batch.positions)
        x = self.embed_tokens[batch.input_ids]
        for index, layer in enumerate(self.layers):
            h = rms_norm(x, layer.input_norm, c.rms_norm_eps)
            qkv = self._project(batch, index, "qkv", h, layer.qkv, layer.qkv_bias)
            qk, v = qkv.split([q_size + kv_size, kv_size], dim=-1)
            qk = apply_rotary(qk.reshape(-1, c.num_heads + c.num_kv_heads, c.head_dim), cos, sin)
            q, k = qk.split([c.num_heads, c.num_kv_heads], dim=1)
            v = v.reshape(-1, c.num_kv_heads, c.head_dim)
            attended = paged_attention(q, k, v, kv.k[index], kv.v[index], batch)
            x = x + self._project(batch, index, "o", attended.view(-1, q_size), layer.o, layer.o_bias)
            h = rms_norm(x, layer.post_attention_norm, c.rms_norm_eps)
            gate, up = self._project(batch, index, "gate_up", h, layer.gate_up).chunk(2, dim=-1)
            x = x + self._project(batch, index, "down", F.silu(gate) * up, layer.down)
        last = rms_norm(x[batch.logits_rows], self.norm, c.rms_norm_eps)
        return F.linear(last, self.lm_head).float()

    def _project(self, batch: ForwardBatch, layer: int, name: str, x: torch.Tensor, weight, bias=None) -> torch.Tensor:
        out = F.linear(x, weight, bias)
        if batch.lora is not None:
            self.lora.add_delta(layer, name, x, out, batch.lora)
        return out
