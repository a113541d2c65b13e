"""An [out, in] projection weight in int4, a bf16 scale and zero per group of input columns,
run by torch's weight-only int4 kernel for the CPU (`aten._weight_int4pack_mm_for_cpu`), which
reads the codes packed two to a byte in its own tiled layout."""

import functools

import torch

from engine.quant.kernel_choice import dequantize_first, dequantized_dtype
from engine.quant.quantize import INT4_MID, quantize_int4_groups

# the packed layout, as torch 2.13 writes it: tiles of TILE rows (64 on a CPU with AVX512, 32
# with AVX2 only), each [in, TILE / 2] bytes whose low nibble holds row r and high nibble row
# r + TILE / 2 of the tile; which height this torch uses is found at first use
TILE_CANDIDATES = (64, 32)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Codes [N, K] in 0..15 -> the kernel's packed uint8 layout."""
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)


def unpack_int4(packed: torch.Tensor, n: int, k: int, tile: int | None = None) -> torch.Tensor:
    """The kernel's packed layout -> codes [N, K] (uint8); needs N % tile == 0 (by default
    this torch's tile_rows())."""
    tile = tile or tile_rows()
    tiles = packed.view(n // tile, k, tile // 2)
    both = torch.cat([tiles & 15, tiles >> 4], dim=-1)  # [tiles, K, tile]
    return both.transpose(1, 2).reshape(n, k)


@functools.cache
def tile_rows() -> int | None:
    """The packed layout's tile height on this CPU, the one that unpack_int4 reads back; None
    when none does (then the kernel is always used)."""
    codes = torch.randint(0, 16, (2 * max(TILE_CANDIDATES), 64), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    packed = pack_int4(codes)
    return next((tile for tile in TILE_CANDIDATES if torch.equal(unpack_int4(packed, *codes.shape, tile), codes)), None)


class Int4Weight:
    width = "int4"
    plain = None  # no bf16 rows kept

    def __init__(self, weight: torch.Tensor, group: int):
        codes, scale, zero = quantize_int4_groups(weight, group)
        self.group = group
        self.shape = tuple(weight.shape)
        self.packed = pack_int4(codes)
        # [K/g, N, 2], as the kernel takes them
        self.scale_and_zero = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous()
        self.nbytes = self.packed.nbytes + self.scale_and_zero.nbytes
        self.read_bytes = self.nbytes  # what one call reads
        # rows the kernel loses to (kernel_choice) are run on a dequantised copy when the layout is known
        self.can_dequantize = tile_rows() is not None and self.shape[0] % tile_rows() == 0

    def codes(self) -> torch.Tensor:
        return unpack_int4(self.packed, *self.shape)

    def dequantized_tiles(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight transposed, tile by tile, [N / T, K, T] (T: tile_rows()) in `dtype`: in the
        packed layout's own order, so that no transposing copy is made (x @ this gives the output
        tile by tile)."""
        (n, k), g, tile = self.shape, self.group, tile_rows()
        tiles = n // tile
        nibbles = self.packed.view(tiles, k, tile // 2)
        codes = torch.stack([nibbles & 15, nibbles >> 4], dim=2).view(tiles, k // g, g, tile)
        # scale and zero [K/g, N] -> [tiles, K/g, 1, T]; a code q means (q - 8) * scale + zero
        scale, zero = (t.reshape(k // g, tiles, 1, tile).transpose(0, 1) for t in self.scale_and_zero.unbind(-1))
        offset = (zero.float() - INT4_MID * scale.float()).to(dtype).contiguous()
        return torch.addcmul(offset, codes.to(dtype), scale.to(dtype).contiguous()).view(tiles, k, tile)

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """[N, K] in `dtype` (for checks; the projection uses dequantized_tiles)."""
        return self.dequantized_tiles(dtype).transpose(1, 2).reshape(self.shape)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        if self.can_dequantize and dequantize_first(rows.shape[0], self.width):
            dtype = dequantized_dtype(x.dtype)
            tiled = torch.matmul(rows.to(dtype), self.dequantized_tiles(dtype)).to(x.dtype)
            out = tiled.transpose(0, 1).reshape(rows.shape[0], -1)
        else:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.packed, self.group, self.scale_and_zero)
        out = out.view(*x.shape[:-1], out.shape[-1])
        return out if bias is None else out + bias
