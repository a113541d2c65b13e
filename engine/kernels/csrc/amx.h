// The AMX kernels (Sapphire Rapids and later): the projections (linear_amx.cpp), which
// linear_cpu.cpp's linear_bf16 hands a matmul to, and a prefill tile's two attention products
// (attention_amx.cpp), which paged_attention_cpu.cpp uses. All take bfloat16 operands as AMX
// wants them: A row-major, B in pairs ([K/2][16 columns][2]), and accumulate in float32.
#pragma once

#include <cstdint>

// whether this build has the AMX kernels and Linux lets this process use the tiles
bool amx_ready();

// out[rows, blocks * 16] = x[rows, k] W^T (+ bias), W blocked [blocks, k/2, 16, 2]; k a multiple of 32
void linear_amx(const uint16_t* x, int64_t rows, int64_t k, const uint16_t* w, int64_t blocks, const uint16_t* bias, uint16_t* out,
                int num_threads);

// On the calling thread, for `vectors` query vectors (queries [vectors rounded up to 16][dim],
// zero past `vectors`) against key tiles 0 .. key_tiles (keys [tile][dim/2][16][2]):
// scores[v * score_stride + key] = scale * q_v . k_key for every key of those tiles. dim a multiple of 32.
void attention_scores_amx(float* scores, int64_t score_stride, const uint16_t* queries, int64_t vectors, const uint32_t* keys,
                          int64_t key_tiles, int64_t dim, float scale);

// On the calling thread: acc[v * dim + d] = sum over keys < 32 pair_tiles of probs[v * prob_stride + key] * v_key[d],
// values [key pair][dim / 16][16][2] (finite, zero or not, past the last key: probs are zero there).
void attention_weigh_amx(float* acc, const uint16_t* probs, int64_t prob_stride, int64_t vectors, const uint32_t* values,
                         int64_t pair_tiles, int64_t dim);

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#define K25_AMX 1
#include <immintrin.h>

namespace k25 {

// the tile registers' shapes, as ldtilecfg reads them (palette 1): rows and bytes per row of each
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

}  // namespace k25
#endif
