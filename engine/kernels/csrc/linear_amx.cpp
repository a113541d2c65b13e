// The bfloat16 projection on a CPU with AMX (Sapphire Rapids and later), over the same blocked
// weights as linear_cpu.cpp: a block's 16 pairs of inputs, [16 pairs][16 columns][2], are 1 KiB
// in a row, exactly the layout (VNNI) of a B tile, so each B tile is one load from the weights
// as they are. x is read in place as A tiles (16 rows by 32 inputs); rows past the last are
// never loaded: the tiles of the last row tile are configured shorter.
// Each thread multiplies 32 columns (2 blocks) by every row, 16 or 32 rows at a time: 4 C tiles
// of 16 x 16 float32, 2 A and 2 B tiles, the 8 tile registers AMX has.
#include "amx.h"
#include "cpu_math.h"

#include <algorithm>

#if defined(K25_AMX)
#include <sys/syscall.h>
#include <unistd.h>

namespace {

constexpr int kBlock = 16;     // output columns of a block (a C and a B tile's width)
constexpr int kTilePairs = 16; // pairs of inputs in a B tile (32 inputs: an A tile's width)
constexpr int kTileRows = 16;  // rows of an A and a C tile

// tmm0-3: C (row tile r, block j) at 2r + j; tmm4-5: A of row tile r; tmm6-7: B of block j
void configure(int rows0, int rows1) {
  k25::TileConfig config;
  const int rows[2] = {rows0, rows1};
  for (int r = 0; r < 2; ++r) {
    for (int j = 0; j < 2; ++j) {
      config.rows[2 * r + j] = rows[r];
      config.colsb[2 * r + j] = kBlock * 4;
    }
    config.rows[4 + r] = rows[r];
    config.colsb[4 + r] = kTilePairs * 4;
  }
  for (int j = 0; j < 2; ++j) {
    config.rows[6 + j] = kTilePairs;
    config.colsb[6 + j] = kBlock * 4;
  }
  _tile_loadconfig(&config);
}

// C tile `tile` (16 x 16 float32, `rows` of them valid) + bias, rounded to bfloat16 into out
void store_rounded(const float* c, int rows, const uint16_t* bias, uint16_t* out, int64_t out_stride) {
  const __m512 b = bias ? k25::widen16(bias) : _mm512_setzero_ps();
  for (int r = 0; r < rows; ++r)
    _mm256_storeu_si256((__m256i*)(out + r * out_stride), (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(_mm512_loadu_ps(c + r * kBlock), b)));
}

// R row tiles (1 or 2) x NB blocks (1 or 2) from x's row `row` and block `block`
template <int R, int NB>
void tile(const uint16_t* x, int64_t k, const uint16_t* w, int64_t pairs, int64_t block, const uint16_t* bias, uint16_t* out,
          int64_t n, const int rows[2]) {
  static_assert(R >= 1 && R <= 2 && NB >= 1 && NB <= 2);
  _tile_zero(0);
  if (NB == 2) _tile_zero(1);
  if (R == 2) _tile_zero(2);
  if (R == 2 && NB == 2) _tile_zero(3);
  const uint16_t* b0 = w + block * pairs * kBlock * 2;
  const uint16_t* b1 = b0 + pairs * kBlock * 2;
  const int64_t x_stride = k * 2, w_stride = kBlock * 4;
  for (int64_t p = 0; p < pairs; p += kTilePairs) {
    _tile_loadd(4, x + 2 * p, x_stride);
    if (R == 2) _tile_loadd(5, x + kTileRows * k + 2 * p, x_stride);
    _tile_loadd(6, b0 + p * kBlock * 2, w_stride);
    if (NB == 2) _tile_loadd(7, b1 + p * kBlock * 2, w_stride);
    _tile_dpbf16ps(0, 4, 6);
    if (NB == 2) _tile_dpbf16ps(1, 4, 7);
    if (R == 2) _tile_dpbf16ps(2, 5, 6);
    if (R == 2 && NB == 2) _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float c[4][kTileRows * kBlock];
  _tile_stored(0, c[0], kBlock * 4);
  if (NB == 2) _tile_stored(1, c[1], kBlock * 4);
  if (R == 2) _tile_stored(2, c[2], kBlock * 4);
  if (R == 2 && NB == 2) _tile_stored(3, c[3], kBlock * 4);
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NB; ++j)
      store_rounded(c[2 * r + j], rows[r], bias ? bias + (block + j) * kBlock : nullptr, out + r * kTileRows * n + (block + j) * kBlock, n);
}

template <int R>
void tile_of(int nb, const uint16_t* x, int64_t k, const uint16_t* w, int64_t pairs, int64_t block, const uint16_t* bias,
             uint16_t* out, int64_t n, const int rows[2]) {
  if (nb == 2) {
    tile<R, 2>(x, k, w, pairs, block, bias, out, n, rows);
  } else {
    tile<R, 1>(x, k, w, pairs, block, bias, out, n, rows);
  }
}

}  // namespace

bool amx_ready() {
  // Linux hands a process the AMX tile state only once it asks (ARCH_REQ_XCOMP_PERM for
  // XFEATURE_XTILEDATA); without it the first tile instruction faults
  static const bool ready = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return ready;
}

void linear_amx(const uint16_t* x, int64_t rows, int64_t k, const uint16_t* w, int64_t blocks, const uint16_t* bias, uint16_t* out,
                int num_threads) {
  const int64_t pairs = k / 2, n = blocks * kBlock, groups = (blocks + 1) / 2, row_pairs = (rows + 2 * kTileRows - 1) / (2 * kTileRows);
  // split by pairs of column blocks: each thread streams its own part of the weights; at
  // most one thread per group, and none for a matmul too small to share
  const int threads = static_cast<int>(std::min<int64_t>(num_threads, groups * pairs * rows > 4096 ? groups : 1));
#pragma omp parallel num_threads(threads)
  {
    int configured[2] = {-1, -1};
#pragma omp for schedule(static)
    for (int64_t group = 0; group < groups; ++group) {
      const int64_t block = 2 * group;
      const int nb = static_cast<int>(std::min<int64_t>(2, blocks - block));
      for (int64_t t = 0; t < row_pairs; ++t) {
        const int64_t first = t * 2 * kTileRows, left = rows - first;
        const int shape[2] = {static_cast<int>(std::min<int64_t>(kTileRows, left)),
                              static_cast<int>(std::clamp<int64_t>(left - kTileRows, 0, kTileRows))};
        if (shape[0] != configured[0] || shape[1] != configured[1]) {
          configure(shape[0], std::max(shape[1], 1));
          configured[0] = shape[0];
          configured[1] = shape[1];
        }
        const uint16_t* tile_x = x + first * k;
        uint16_t* tile_out = out + first * n;
        if (shape[1] > 0) {
          tile_of<2>(nb, tile_x, k, w, pairs, block, bias, tile_out, n, shape);
        } else {
          tile_of<1>(nb, tile_x, k, w, pairs, block, bias, tile_out, n, shape);
        }
      }
    }
    if (configured[0] >= 0) _tile_release();
  }
}

#else

bool amx_ready() { return false; }

void linear_amx(const uint16_t*, int64_t, int64_t, const uint16_t*, int64_t, const uint16_t*, uint16_t*, int) {}

#endif
