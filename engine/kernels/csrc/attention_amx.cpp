// A prefill tile's two attention products on AMX (paged_attention_cpu.cpp calls them per tile
// of query vectors, after packing its sequence's context once per KV head):
// - scores: 16 query vectors x 32 dims (an A tile) times a key tile's 16 pairs of dims x 16
//   keys (a B tile, the packed keys as they are), two key tiles per A load;
// - p.v: 16 vectors' probabilities for 32 keys (A) times 16 pairs of keys x 16 dims of V (B,
//   the packed values as they are), up to 4 tiles of 16 output dims per A load.
// Both accumulate in float32, as the AVX512-BF16 path beside them does.
#include "amx.h"

#include <algorithm>

#if defined(K25_AMX)

namespace {

constexpr int64_t kRows = 16;  // vectors per A and C tile
constexpr int64_t kLanes = 16;  // keys (scores) or dims (p.v) per B and C tile
constexpr int64_t kPairs = 16;  // pairs per B tile (32 dims, or 32 keys)
constexpr int kColumnTiles = 4;  // p.v: C tiles at once

// every tile register 16 rows of 64 bytes (the last A and C rows past `vectors` are padding)
void configure_full() {
  k25::TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = kRows;
    config.colsb[t] = 64;
  }
  _tile_loadconfig(&config);
}

}  // namespace

void attention_scores_amx(float* scores, int64_t score_stride, const uint16_t* queries, int64_t vectors, const uint32_t* keys,
                          int64_t key_tiles, int64_t dim, float scale) {
  configure_full();
  const int64_t pairs = dim / 2, steps = dim / 32;
  alignas(64) float c[2][kRows * kLanes];
  for (int64_t v0 = 0; v0 < vectors; v0 += kRows) {
    const int64_t count = std::min(kRows, vectors - v0);
    for (int64_t tile = 0; tile < key_tiles; tile += 2) {
      const bool two = tile + 1 < key_tiles;
      _tile_zero(0);
      _tile_zero(1);
      for (int64_t step = 0; step < steps; ++step) {  // tmm2: A, tmm3/4: the two key tiles' B
        _tile_loadd(2, queries + v0 * dim + step * 32, dim * 2);
        _tile_loadd(3, keys + (tile * pairs + step * kPairs) * kLanes, kLanes * 4);
        _tile_dpbf16ps(0, 2, 3);
        if (two) {
          _tile_loadd(4, keys + ((tile + 1) * pairs + step * kPairs) * kLanes, kLanes * 4);
          _tile_dpbf16ps(1, 2, 4);
        }
      }
      _tile_stored(0, c[0], kLanes * 4);
      if (two) _tile_stored(1, c[1], kLanes * 4);
      const __m512 scaled = _mm512_set1_ps(scale);
      for (int64_t r = 0; r < count; ++r) {
        float* row = scores + (v0 + r) * score_stride + tile * kLanes;
        _mm512_storeu_ps(row, _mm512_mul_ps(_mm512_load_ps(c[0] + r * kLanes), scaled));
        if (two) _mm512_storeu_ps(row + kLanes, _mm512_mul_ps(_mm512_load_ps(c[1] + r * kLanes), scaled));
      }
    }
  }
  _tile_release();
}

void attention_weigh_amx(float* acc, const uint16_t* probs, int64_t prob_stride, int64_t vectors, const uint32_t* values,
                         int64_t pair_tiles, int64_t dim) {
  configure_full();
  const int64_t columns = dim / kLanes;
  alignas(64) float c[kRows * kLanes];
  for (int64_t v0 = 0; v0 < vectors; v0 += kRows) {
    const int64_t count = std::min(kRows, vectors - v0);
    for (int64_t first = 0; first < columns; first += kColumnTiles) {  // tmm0-3: C, tmm4: A, tmm5: B
      const int64_t group = std::min<int64_t>(kColumnTiles, columns - first);
      // tile numbers are immediates: each tile spelled out
      _tile_zero(0);
      if (group > 1) _tile_zero(1);
      if (group > 2) _tile_zero(2);
      if (group > 3) _tile_zero(3);
      for (int64_t tile = 0; tile < pair_tiles; ++tile) {
        _tile_loadd(4, probs + v0 * prob_stride + tile * 2 * kPairs, prob_stride * 2);
        const uint32_t* b = values + (tile * kPairs * columns + first) * kLanes;
        const int64_t b_stride = columns * kLanes * 4;
        _tile_loadd(5, b, b_stride);
        _tile_dpbf16ps(0, 4, 5);
        if (group > 1) {
          _tile_loadd(5, b + kLanes, b_stride);
          _tile_dpbf16ps(1, 4, 5);
        }
        if (group > 2) {
          _tile_loadd(5, b + 2 * kLanes, b_stride);
          _tile_dpbf16ps(2, 4, 5);
        }
        if (group > 3) {
          _tile_loadd(5, b + 3 * kLanes, b_stride);
          _tile_dpbf16ps(3, 4, 5);
        }
      }
      for (int t = 0; t < group; ++t) {
        switch (t) {
          case 0: _tile_stored(0, c, kLanes * 4); break;
          case 1: _tile_stored(1, c, kLanes * 4); break;
          case 2: _tile_stored(2, c, kLanes * 4); break;
          default: _tile_stored(3, c, kLanes * 4); break;
        }
        for (int64_t r = 0; r < count; ++r)
          _mm512_storeu_ps(acc + (v0 + r) * dim + (first + t) * kLanes, _mm512_load_ps(c + r * kLanes));
      }
    }
  }
  _tile_release();
}

#else

void attention_scores_amx(float*, int64_t, const uint16_t*, int64_t, const uint32_t*, int64_t, int64_t, float) {}
void attention_weigh_amx(float*, const uint16_t*, int64_t, int64_t, const uint32_t*, int64_t, int64_t) {}

#endif
