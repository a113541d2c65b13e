"""The elementwise steps of a decoder layer between its matmuls: RMSNorm (after the residual
add), rotary embedding with the KV-cache write, SwiGLU's silu(gate) * up.

Each has a torch version (CUDA, and a CPU where the kernels could not be built) and, on a
CPU, a fused C++ one (engine/kernels/csrc/layer_ops_cpu.cpp) that does in one pass what the torch
version does in 3-10 ops: at batch 1 the dispatch of those ops cost more than their
arithmetic. The C++ versions compute in float32 and round once; the torch ones round after
each op, as Hugging Face's do in bf16 (tests/engine/model/test_layer_ops.py bounds both against
float64)."""

import torch
import torch.nn.functional as F

from engine.kernels.cpu_build import cpu_kernel
from engine.model.rope import apply_rotary


def _fused(t: torch.Tensor):
    """The C++ module when `t` is on a CPU and it was built, else None."""
    return cpu_kernel() if t.device.type == "cpu" else None


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x (the fp32 residual stream, [tokens, hidden]) += delta in place when given; then x
    normalised in fp32, cast to the weight's dtype and scaled (as Hugging Face's LlamaRMSNorm)."""
    kernel = _fused(x)
    if kernel is not None:
        return kernel.add_rms_norm(x, delta, weight, eps)
    if delta is not None:
        x += delta
    return weight * F.rms_norm(x, x.shape[-1:], eps=eps).to(weight.dtype)


def rotary_to_cache(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                    slot_mapping: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, heads: int) -> torch.Tensor:
    """qkv [tokens, (heads + 2 kv_heads) * head_dim], one layer's projection: q and k rotated for
    `positions` (cos, sin: the tables [positions, head_dim / 2]), k and v written into the
    caches [kv_heads, slots, head_dim] at `slot_mapping`. Returns q [tokens, heads, head_dim]."""
    kernel = _fused(qkv)
    if kernel is not None:
        return kernel.rotary_to_cache(qkv, cos, sin, positions, slot_mapping, k_cache, v_cache, heads)
    kv_heads, _, head_dim = k_cache.shape
    qk, v = qkv.split([(heads + kv_heads) * head_dim, kv_heads * head_dim], dim=-1)
    qk = apply_rotary(qk.reshape(-1, heads + kv_heads, head_dim), cos[positions].unsqueeze(1), sin[positions].unsqueeze(1))
    q, k = qk.split([heads, kv_heads], dim=1)
    k_cache.index_copy_(1, slot_mapping, k.transpose(0, 1))
    v_cache.index_copy_(1, slot_mapping, v.reshape(-1, kv_heads, head_dim).transpose(0, 1))
    return q.contiguous()


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[tokens, 2 * inner] (gate and up stacked) -> silu(gate) * up [tokens, inner]."""
    kernel = _fused(gate_up)
    if kernel is not None:
        return kernel.silu_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
