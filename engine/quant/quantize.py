"""Round-to-nearest weight quantization and its exact inverse, as plain tensor functions.

Scales and zeros are stored in the compute dtype (bfloat16; the kernels take them so), rounded
so that no weight needs clamping: a scale is rounded up, never down. The codes are computed
against the stored (rounded) scale and zero, so that dequantising gives each int8 weight back
within half a step, and each int4 group with no more squared error than its min/max grid's
(half a step a weight, plus the zero's own rounding)."""

import torch

INT8_MAX = 127
INT4_LEVELS = 15  # codes 0..15
INT4_MID = 8  # the kernel dequantises a code q as (q - 8) * scale + zero
REFINE_STEPS = 2  # least-squares refits of an int4 group's grid (quantize_int4_groups)


def round_up_to(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`values` (fp32, >= 0) in `dtype`, never below the value: nearest rounding of v(1 + 2^-mantissa)
    lands at or above v for every v."""
    up = values * (1 + torch.finfo(dtype).eps)  # eps = 2^-mantissa bits
    return up.to(dtype)


def quantize_int8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] -> (codes int8 [N, K], scale [N] in weight's dtype): symmetric, one scale per row."""
    w = weight.float()
    scale = round_up_to(w.abs().amax(dim=1) / INT8_MAX, weight.dtype)
    safe = torch.where(scale == 0, 1.0, scale.float())
    codes = torch.round(w / safe[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return codes, scale


def dequantize_int8_rows(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Weights [N, K] in `dtype` (in fp32 exact: an int8 code times a 16-bit scale fits its mantissa;
    in bf16 rounded once)."""
    return codes * scale.to(dtype)[:, None]  # int8 * float promotes to the float dtype in one pass


def quantize_int4_groups(weight: torch.Tensor, group: int,
                         refine_steps: int = REFINE_STEPS) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[N, K] -> (codes uint8 [N, K] in 0..15, scale [N, K/group], zero [N, K/group]), both in
    weight's dtype: asymmetric per group of `group` input columns, w ~ (q - 8) * scale + zero.

    Starts from the group's min/max grid (every weight within half a step); then, `refine_steps`
    times, fits scale and zero to the codes by least squares, rounds the codes again, and keeps
    the new grid only for groups whose squared error it lowers. A weight may then sit outside
    the grid, but no group's error exceeds the min/max grid's. (Weights that came from a 4-bit
    checkpoint lie on a grid that need not span their min and max; the fit finds it again.)"""
    n, k = weight.shape
    w = weight.float().view(n, k // group, group)
    low, high = w.amin(dim=-1), w.amax(dim=-1)
    scale = round_up_to((high - low) / INT4_LEVELS, weight.dtype)
    zero = (low + INT4_MID * scale.float()).to(weight.dtype)
    codes, error = _int4_codes(w, scale, zero)
    for _ in range(refine_steps):
        centred = codes - INT4_MID
        c_mean, w_mean = centred.mean(-1), w.mean(-1)
        variance = (centred * centred).mean(-1) - c_mean * c_mean
        fitted = ((centred * w).mean(-1) - c_mean * w_mean) / variance.clamp(min=1e-12)
        better_scale = torch.where(variance > 0, fitted, scale.float()).clamp(min=0).to(weight.dtype)
        better_zero = (w_mean - better_scale.float() * c_mean).to(weight.dtype)
        better_codes, better_error = _int4_codes(w, better_scale, better_zero)
        take = better_error < error
        scale, zero = torch.where(take, better_scale, scale), torch.where(take, better_zero, zero)
        codes, error = torch.where(take[..., None], better_codes, codes), torch.minimum(error, better_error)
    return codes.to(torch.uint8).view(n, k), scale, zero


def _int4_codes(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Nearest codes of grouped weights w [N, G, g] (fp32) on the grid (scale, zero), and each group's squared error."""
    s, z = scale.float()[..., None], zero.float()[..., None]
    codes = torch.round((w - z) / torch.where(s == 0, 1.0, s) + INT4_MID).clamp_(0, INT4_LEVELS)
    error = ((codes - INT4_MID) * s + z - w).square().sum(-1)
    return codes, error


def dequantize_int4_groups(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                           dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Codes [N, K] (any integer dtype) with scale and zero [N, K/group] -> weights [N, K] in `dtype`."""
    n, k = codes.shape
    groups = scale.shape[1]
    q = codes.reshape(n, groups, k // groups).to(dtype) - INT4_MID
    return torch.addcmul(zero.to(dtype)[..., None], q, scale.to(dtype)[..., None]).reshape(n, k)
