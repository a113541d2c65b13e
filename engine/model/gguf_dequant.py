"""Dequantising GGUF tensors to fp32 with vectorised torch.

Each block format is read as a (n_blocks, block_bytes) uint8 matrix; scales are reinterpreted in
place (`view(dtype)` on column slices), quants are unpacked with shifts and masks over whole
matrices. Layouts follow ggml's block structs (ggml-common.h).
"""

import numpy as np
import torch

from common.gguf_file import BLOCK_LAYOUT, TensorType


def _f16(blocks: torch.Tensor, at: int) -> torch.Tensor:
    """The fp16 stored at byte `at` of every block, as an (n, 1) fp32 column."""
    return blocks[:, at : at + 2].view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """(n, k) packed bytes -> (n, 2k): the k low nibbles, then the k high nibbles."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1)


def _bits(packed: torch.Tensor) -> torch.Tensor:
    """(n, k) bytes -> (n, 8k) bits, little-endian: bit i of the packed integer at column i."""
    shifts = torch.arange(8, dtype=torch.uint8)
    return ((packed.unsqueeze(-1) >> shifts) & 1).flatten(-2)


def _q4_0(b):
    return (_nibbles(b[:, 2:18]).float() - 8).mul_(_f16(b, 0))


def _q4_1(b):
    return _nibbles(b[:, 4:20]).float().mul_(_f16(b, 0)).add_(_f16(b, 2))


def _q5_0(b):
    q = _nibbles(b[:, 6:22]) | (_bits(b[:, 2:6]) << 4)
    return (q.float() - 16).mul_(_f16(b, 0))


def _q5_1(b):
    q = _nibbles(b[:, 8:24]) | (_bits(b[:, 4:8]) << 4)
    return q.float().mul_(_f16(b, 0)).add_(_f16(b, 2))


def _q8_0(b):
    return b[:, 2:34].view(torch.int8).float().mul_(_f16(b, 0))


def _k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins, each (n, 8)."""
    lo, mid, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    scales = torch.cat([lo & 63, (hi & 0x0F) | ((lo >> 6) << 4)], dim=1)
    mins = torch.cat([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], dim=1)
    return scales.float(), mins.float()


def _k_nibbles(qs: torch.Tensor) -> torch.Tensor:
    """(n, 128) -> (n, 8, 32): per 32-byte chunk, its low nibbles then its high nibbles."""
    chunks = qs.reshape(-1, 4, 1, 32)
    return torch.cat([chunks & 0x0F, chunks >> 4], dim=2).reshape(-1, 8, 32)


def _q4_k(b):
    scales, mins = _k_scales(b[:, 4:16])
    q = _k_nibbles(b[:, 16:144]).float()
    out = q * (_f16(b, 0) * scales).unsqueeze(-1) - (_f16(b, 2) * mins).unsqueeze(-1)
    return out.reshape(-1, 256)


def _q5_k(b):
    scales, mins = _k_scales(b[:, 4:16])
    # sub-block s takes its fifth bit from bit s of each of the 32 qh bytes
    high = (b[:, 16:48].unsqueeze(1) >> torch.arange(8, dtype=torch.uint8).view(1, 8, 1)) & 1
    q = (_k_nibbles(b[:, 48:176]) | (high << 4)).float()
    out = q * (_f16(b, 0) * scales).unsqueeze(-1) - (_f16(b, 2) * mins).unsqueeze(-1)
    return out.reshape(-1, 256)


def _q6_k(b):
    ql = b[:, 0:128].reshape(-1, 2, 2, 32)  # (half, first/second 32 bytes, l)
    low = torch.cat([ql & 0x0F, ql >> 4], dim=2)  # (n, 2, 4, 32): the four 32-weight runs of a half
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(1, 1, 4, 1)
    high = (b[:, 128:192].reshape(-1, 2, 1, 32) >> shifts) & 3
    q = ((low | (high << 4)).to(torch.int16) - 32).float().reshape(-1, 16, 16)
    scales = b[:, 192:208].view(torch.int8).float() * _f16(b, 208)
    return (q * scales.unsqueeze(-1)).reshape(-1, 256)


def _plain(dtype):
    return lambda b: b.reshape(-1).view(dtype).float()


_DEQUANT = {
    TensorType.F32: lambda b: b.reshape(-1).view(torch.float32).clone(),
    TensorType.F16: _plain(torch.float16),
    TensorType.BF16: _plain(torch.bfloat16),
    TensorType.Q4_0: _q4_0,
    TensorType.Q4_1: _q4_1,
    TensorType.Q5_0: _q5_0,
    TensorType.Q5_1: _q5_1,
    TensorType.Q8_0: _q8_0,
    TensorType.Q4_K: _q4_k,
    TensorType.Q5_K: _q5_k,
    TensorType.Q6_K: _q6_k,
}

SUPPORTED_TYPES = frozenset(t.name for t in _DEQUANT)


def is_supported(tensor_type: int) -> bool:
    return tensor_type in _DEQUANT


def dequantize(raw: np.ndarray, tensor_type: int, shape: tuple[int, ...]) -> torch.Tensor:
    """Raw GGUF bytes (a writable uint8 array) of one tensor -> an fp32 tensor of `shape` (numpy order)."""
    _, block_bytes = BLOCK_LAYOUT[TensorType(tensor_type)]
    blocks = torch.from_numpy(raw).view(-1, block_bytes)
    return _DEQUANT[TensorType(tensor_type)](blocks).reshape(shape)
