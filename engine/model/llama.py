"""The Llama-family forward pass (Llama, Qwen2-style GQA, SmolLM), written for paged KV.

RMSNorm -> attention (RoPE, GQA) -> residual -> RMSNorm -> SwiGLU MLP -> residual, per
layer; final norm and the LM head run only on rows whose next token is sampled."""

from dataclasses import dataclass

import torch

from common.quant_spec import NO_QUANT, LayerQuant, QuantSpec
from engine.attention.backend import choose_attention_backend
from engine.attention.kv_cache import KVCache
from engine.attention.metadata import ForwardBatch
from engine.base.model_config import ModelConfig
from engine.lora.slots import LoRASlots
from engine.model.layer_ops import add_rms_norm, rotary_to_cache, silu_mul
from engine.model.linear import Weight
from engine.model.rope import RotaryEmbedding
from engine.model.top_k import top_k_indices
from engine.quant import build


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: Weight  # q, k and v projections stacked: one matmul (a Weight, or a quantised kind: engine/quant/)
    qkv_bias: torch.Tensor | None  # Qwen2 has attention biases, Llama does not
    o: Weight
    o_bias: torch.Tensor | None
    post_attention_norm: torch.Tensor
    gate_up: Weight  # gate and up projections stacked
    down: Weight


# logits recomputed in fp32 per row when the head runs in 16 bits (see LlamaModel.logits)
REFINED_LOGITS = 8


def projection(weight: torch.Tensor, layer: LayerQuant, keep_plain: bool = False):
    """`weight` at its layer type's width: a Weight (packed bf16 or plain), or a quantised kind."""
    return build.quantized_projection(weight, layer) if layer.quantized else Weight(weight, keep_plain)


class LlamaModel:
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], device, dtype: torch.dtype,
                 lora: LoRASlots | None = None, quant: QuantSpec = NO_QUANT):
        """`quant`: each layer type's width (engine/quant/check.py says which run where)."""
        self.config = config
        self.dtype = dtype
        self.quant = quant
        self.lora = lora  # adapters' deltas, added to the projections of tokens that use one
        self.attention = choose_attention_backend(device)  # once: every layer of every step uses it
        self.attention_scale = config.head_dim**-0.5

        def w(name: str) -> torch.Tensor:
            return weights[name].to(device=device, dtype=dtype)

        self.embed_tokens = build.embedding(w("model.embed_tokens.weight"), quant.embed)
        self.layers = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            self.layers.append(
                LayerWeights(
                    input_norm=w(p + "input_layernorm.weight"),
                    qkv=projection(torch.cat([w(p + f"self_attn.{n}_proj.weight") for n in "qkv"]), quant.attn),
                    qkv_bias=(
                        torch.cat([w(p + f"self_attn.{n}_proj.bias") for n in "qkv"])
                        if p + "self_attn.q_proj.bias" in weights
                        else None
                    ),
                    o=projection(w(p + "self_attn.o_proj.weight"), quant.attn),
                    o_bias=w(p + "self_attn.o_proj.bias") if p + "self_attn.o_proj.bias" in weights else None,
                    post_attention_norm=w(p + "post_attention_layernorm.weight"),
                    gate_up=projection(torch.cat([w(p + "mlp.gate_proj.weight"), w(p + "mlp.up_proj.weight")]), quant.mlp),
                    down=projection(w(p + "mlp.down_proj.weight"), quant.mlp),
                )
            )
        self.norm = w("model.norm.weight").float()  # the head's input stays fp32 (see logits)
        # the head keeps its plain rows beside a packed copy: logits() reads the best ones again;
        # a quantised head reads them from the embedding when tied, else from the plain head kept
        head = w("model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight")
        self.lm_head = projection(head, quant.head, keep_plain=True)
        self.head_rows = self.lm_head.plain if self.lm_head.plain is not None else (
            self.embed_tokens if config.tie_word_embeddings else head)
        self.rope = RotaryEmbedding(
            config.head_dim, config.max_position_embeddings, config.rope_theta, config.rope_scaling, device, dtype
        )
        tensors = [self.embed_tokens, self.norm] + [t for layer in self.layers for t in vars(layer).values()] + [self.lm_head]
        if self.head_rows is not self.lm_head.plain and self.head_rows is not self.embed_tokens:
            tensors.append(self.head_rows)  # an untied quantised head's plain rows
        self.weight_bytes = sum(t.nbytes for t in tensors if t is not None)
        if self.lm_head.plain is self.embed_tokens:  # tied: its plain rows are the embedding, counted once
            self.weight_bytes -= self.embed_tokens.nbytes

    def forward(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        """Logits [len(batch.logits_rows), vocab] for the rows that are sampled."""
        c = self.config
        eps, q_size = c.rms_norm_eps, c.num_heads * c.head_dim
        # the residual stream stays in fp32 whatever the weights' dtype: in bf16 (8 mantissa bits)
        # each of the 2 x layers updates added to it would be rounded (SmolLM2 teacher-forced:
        # top-1 agreement with fp32 0.960 with a bf16 residual, 0.967 with this)
        x = self.embed_tokens[batch.input_ids].float()
        mlp_out = None  # each layer's MLP output is added to x by the next layer's first norm
        for index, layer in enumerate(self.layers):
            h = add_rms_norm(x, mlp_out, layer.input_norm, eps)
            qkv = self._project(batch, index, "qkv", h, layer.qkv, layer.qkv_bias)
            q = rotary_to_cache(qkv, self.rope.cos, self.rope.sin, batch.positions, batch.slot_mapping, kv.k[index], kv.v[index],
                                c.num_heads)
            attended = self.attention.forward(q, kv.k[index], kv.v[index], batch, self.attention_scale)
            h = add_rms_norm(x, self._project(batch, index, "o", attended.view(-1, q_size), layer.o, layer.o_bias),
                             layer.post_attention_norm, eps)
            mlp_out = self._project(batch, index, "down", silu_mul(self._project(batch, index, "gate_up", h, layer.gate_up)),
                                    layer.down)
        x += mlp_out
        return self.logits(add_rms_norm(x[batch.logits_rows], None, self.norm, eps))

    def logits(self, last: torch.Tensor) -> torch.Tensor:
        """fp32 logits of the final hidden states `last` (fp32). In a 16-bit dtype the head runs
        in that dtype, then the best REFINED_LOGITS logits of each row are computed again in fp32:
        16-bit logits step by 0.125 between 16 and 32, so near-ties between the best tokens would
        be decided by rounding (SmolLM2 in bf16 picks another token than fp32 at 3% of positions,
        at 2% with this), while the full fp32 head would cost a second copy of it and its
        bandwidth at every step."""
        if self.dtype == torch.float32:
            return self.lm_head(last)
        rounded = self.lm_head(last.to(self.dtype))
        best = top_k_indices(rounded, min(REFINED_LOGITS, rounded.shape[-1]))  # [S, k]
        logits = rounded.float()
        exact = (self.head_rows[best].float() @ last.unsqueeze(-1)).squeeze(-1)
        return logits.scatter_(1, best, exact)

    def _project(self, batch: ForwardBatch, layer: int, name: str, x: torch.Tensor, weight: Weight, bias=None) -> torch.Tensor:
        out = weight(x, bias)
        if batch.lora is not None:
            self.lora.add_delta(layer, name, x, out, batch.lora)
        return out
