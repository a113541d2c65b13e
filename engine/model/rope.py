"""Rotary position embeddings with the checkpoint's theta and scaling (HF half-rotation layout)."""

import math

import torch

from engine.base.errors import EngineConfigError


def inverse_frequencies(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if rope_type == "default":
        return inv_freq.float()
    if rope_type == "linear":
        return (inv_freq / scaling["factor"]).float()
    if rope_type == "llama3":
        return _llama3_frequencies(inv_freq, scaling).float()
    raise EngineConfigError(f"unsupported rope_scaling type {rope_type!r} (supported: default, linear, llama3)")


def _llama3_frequencies(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    factor = scaling["factor"]
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    original = scaling["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv_freq
    smooth = (original / wavelength - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
    in_band = (wavelength <= original / low) & (wavelength >= original / high)
    return torch.where(in_band, blended, out)


class RotaryEmbedding:
    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: dict | None, device, dtype):
        inv_freq = inverse_frequencies(head_dim, theta, scaling)
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        # [positions, head_dim / 2]: Hugging Face repeats the angles for both halves of the head; one half is all we need
        self.cos = angles.cos().to(device=device, dtype=dtype)
        self.sin = angles.sin().to(device=device, dtype=dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [tokens, heads, head_dim], rotating the pairs (i, i + head_dim / 2) as Hugging Face does."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)
