// The bfloat16 projection y = x W^T (+ bias) on a CPU with AVX512-BF16, over weights blocked
// once at load (engine/model/linear.py): [N/16][K/2][16][2], i.e. for each 16 output columns, the
// pairs of input elements one vdpbf16ps multiplies. Each block is one sequential stream, so a
// decode step's few rows read the weights near the memory's speed (engine/model/linear.py has the
// figures against oneDNN's packed layout), and at prefill's hundreds of rows an 8-row x
// 48-column register tile keeps the multipliers busy: its 24 accumulators load 3 weight vectors
// and 8 broadcasts a step (a 12 x 32 tile, 2 and 12, was 4-7% slower at 512 rows).
// Accumulates in float32, rounds once to bfloat16 (to nearest even), as oneDNN does. Where the
// CPU has AMX, linear_bf16 hands inputs of whole 32-wide tiles to linear_amx.cpp instead; where
// it has AVX2 but no AVX512-BF16, every input goes to linear_avx2.cpp.
#include "aten_parts.h"

#include <cstdint>

#include "amx.h"
#include "cpu_math.h"

// linear_avx2.cpp
bool has_avx2_linear();
at::Tensor linear_avx2(const at::Tensor& x, const at::Tensor& blocked, const c10::optional<at::Tensor>& bias);

#if defined(__AVX512BF16__)
#include <immintrin.h>

namespace {

constexpr int kBlock = 16;       // output columns a vector holds
constexpr int kTileRows = 8;     // rows of x a tile multiplies at once
constexpr int kTileBlocks = 3;   // blocks of 16 columns a tile multiplies at once


// rows R of x (x_pairs: K/2 pairs a row) times NB blocks from `first_block`, into out's columns.
template <int R, int NB>
void tile(const uint32_t* x_pairs, int64_t pairs, const uint32_t* w, int64_t first_block, const uint16_t* bias,
          uint16_t* out, int64_t out_stride) {
  __m512 acc[R][NB];
  for (int j = 0; j < NB; ++j) {
    const __m512 start = bias ? k25::widen16(bias + (first_block + j) * kBlock) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) acc[r][j] = start;
  }
  const uint32_t* block[NB];
  for (int j = 0; j < NB; ++j) block[j] = w + (first_block + j) * pairs * kBlock;
  for (int64_t k = 0; k < pairs; ++k) {
    __m512i wv[NB];
    for (int j = 0; j < NB; ++j) wv[j] = _mm512_loadu_si512(block[j] + k * kBlock);
    for (int r = 0; r < R; ++r) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(x_pairs[r * pairs + k]);
      for (int j = 0; j < NB; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], (__m512bh)wv[j], xv);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NB; ++j)
      _mm256_storeu_si256((__m256i*)(out + r * out_stride + (first_block + j) * kBlock), (__m256i)_mm512_cvtneps_pbh(acc[r][j]));
}

template <int NB>
void tile_of(int64_t rows, const uint32_t* x_pairs, int64_t pairs, const uint32_t* w, int64_t first_block,
             const uint16_t* bias, uint16_t* out, int64_t out_stride) {
  switch (rows) {
#define K25_TILE(R) \
  case R: return tile<R, NB>(x_pairs, pairs, w, first_block, bias, out, out_stride);
    K25_TILE(1) K25_TILE(2) K25_TILE(3) K25_TILE(4) K25_TILE(5) K25_TILE(6) K25_TILE(7) K25_TILE(8)
#undef K25_TILE
  }
}

}  // namespace
#endif

bool has_bf16_linear() {
#if defined(__AVX512BF16__)
  return true;
#else
  return has_avx2_linear();
#endif
}

// amx=false keeps the AVX512-BF16 kernel where AMX could run (the tests check both on one machine)
at::Tensor linear_bf16(at::Tensor x, at::Tensor blocked, c10::optional<at::Tensor> bias, bool amx) {
  TORCH_CHECK(has_bf16_linear(), "linear_bf16: this build has neither AVX512-BF16 nor AVX2");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "linear_bf16: x must be [rows, K] bfloat16");
  TORCH_CHECK(blocked.dim() == 4 && blocked.scalar_type() == at::kBFloat16 && blocked.is_contiguous() && blocked.size(2) == 16 &&
                  blocked.size(3) == 2,
              "linear_bf16: the weight must be blocked [N/16, K/2, 16, 2] bfloat16 (engine/model/linear.py)");
  const int64_t rows = x.size(0), blocks = blocked.size(0), pairs = blocked.size(1), n = blocks * 16;
  TORCH_CHECK(x.size(1) == 2 * pairs, "linear_bf16: x has ", x.size(1), " columns, the weight takes ", 2 * pairs);
  if (bias) {
    TORCH_CHECK(bias->scalar_type() == at::kBFloat16 && bias->numel() == n && bias->is_contiguous(),
                "linear_bf16: bias must be ", n, " contiguous bfloat16");
  }
  x = x.contiguous();
#if defined(__AVX512BF16__)
  auto out = at::empty({rows, n}, x.options());
  const auto* x_pairs = reinterpret_cast<const uint32_t*>(x.data_ptr());
  const auto* w = reinterpret_cast<const uint32_t*>(blocked.data_ptr());
  const auto* b = bias ? reinterpret_cast<const uint16_t*>(bias->data_ptr()) : nullptr;
  auto* o = reinterpret_cast<uint16_t*>(out.data_ptr());
  if (amx && pairs % 16 == 0 && amx_ready()) {
    linear_amx(reinterpret_cast<const uint16_t*>(x_pairs), rows, 2 * pairs, reinterpret_cast<const uint16_t*>(w), blocks, b, o,
               at::get_num_threads());
    return out;
  }
  const int64_t block_groups = (blocks + kTileBlocks - 1) / kTileBlocks, row_tiles = (rows + kTileRows - 1) / kTileRows;
  // split by column blocks: each thread streams its own part of the weights, once per row tile
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads()) if (block_groups * pairs * rows > 4096)
  for (int64_t group = 0; group < block_groups; ++group) {
    const int64_t first_block = group * kTileBlocks, tile_blocks = std::min<int64_t>(kTileBlocks, blocks - first_block);
    for (int64_t t = 0; t < row_tiles; ++t) {
      const int64_t first_row = t * kTileRows, tile_rows = std::min<int64_t>(kTileRows, rows - first_row);
      const uint32_t* tile_x = x_pairs + first_row * pairs;
      uint16_t* tile_out = o + first_row * n;
      if (tile_blocks == 3) {
        tile_of<3>(tile_rows, tile_x, pairs, w, first_block, b, tile_out, n);
      } else if (tile_blocks == 2) {
        tile_of<2>(tile_rows, tile_x, pairs, w, first_block, b, tile_out, n);
      } else {
        tile_of<1>(tile_rows, tile_x, pairs, w, first_block, b, tile_out, n);
      }
    }
  }
  return out;
#else
  return linear_avx2(x, blocked, bias);
#endif
}
