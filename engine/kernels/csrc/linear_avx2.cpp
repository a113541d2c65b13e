// The bfloat16 projection y = x W^T (+ bias) on a CPU with AVX2 and FMA but no bf16
// instructions (AMD Zen 2 and 3, Intel before Cooper Lake), over the same blocked weights as
// linear_cpu.cpp ([N/16][K/2][16][2]). A bf16 is the upper half of a float32, so each 32-bit
// pair of a weight vector widens in registers with one instruction per element: the pair's
// first input shifted up 16 bits, its second masked. Those multiply x (widened to float32 once
// per call) with fused multiply-adds in float32, so a decode step reads half the bytes of
// float32 weights, and more rows run as 5-row x 16-column register tiles (10 accumulators, the
// most that leaves AVX2's 16 registers room for the four widened weight vectors and the two
// broadcasts). Rows are taken in chunks whose float32 copy stays in L2 while every block of the
// thread's columns passes over it. Rounds once to bfloat16, to nearest even. From kWidenRows
// rows on (prefill), torch's float32 GEMM on a widened copy of the weight instead (below).
#include "aten_parts.h"

#include "cpu_math.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

namespace {

constexpr int kTileRows = 5;
constexpr int64_t kChunkFloats = 32768;  // 128 KB of widened x per row chunk

using k25::widen8;

// a weight vector's 8 pairs as float32: their first inputs, their second inputs
inline __m256 first_of(__m256i pairs) { return _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16)); }
inline __m256 second_of(__m256i pairs) {
  return _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u))));
}

// 8 floats to bfloat16, to nearest even (a NaN stays a quiet NaN), as torch's casts round
inline __m128i round8(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
  rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  // 32 to 16 bits within each 128-bit lane, then the two lanes' low halves together
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(rounded, rounded), 0x08));
}

// one row's two accumulators (columns 0-7 and 8-15) across a pair of inputs
#define K25_ROW(r)                                                                                          \
  if constexpr (R > r) {                                                                                    \
    const __m256 xa = _mm256_broadcast_ss(xr + r * k), xb = _mm256_broadcast_ss(xr + r * k + 1);            \
    left##r = _mm256_fmadd_ps(second0, xb, _mm256_fmadd_ps(first0, xa, left##r));                          \
    right##r = _mm256_fmadd_ps(second1, xb, _mm256_fmadd_ps(first1, xa, right##r));                         \
  }
#define K25_STORE(r)                                                                                        \
  if constexpr (R > r) {                                                                                    \
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + r * out_stride), round8(left##r));                    \
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + r * out_stride + 8), round8(right##r));               \
  }

// R rows of x (float32, `k` a row) times one block of 16 columns (its k/2 pair vectors). The
// accumulators are named variables: as an array, GCC 12 stored them to the stack every pair.
template <int R>
void tile(const float* x, int64_t k, const uint32_t* block, const uint16_t* bias, uint16_t* out, int64_t out_stride) {
  const __m256 low = bias ? widen8(bias) : _mm256_setzero_ps(), high = bias ? widen8(bias + 8) : _mm256_setzero_ps();
  __m256 left0 = low, left1 = low, left2 = low, left3 = low, left4 = low;
  __m256 right0 = high, right1 = high, right2 = high, right3 = high, right4 = high;
  const float* xr = x;
  for (int64_t p = 0; p < k / 2; ++p, xr += 2) {
    const __m256i* pair = reinterpret_cast<const __m256i*>(block + p * 16);
    const __m256i w0 = _mm256_loadu_si256(pair), w1 = _mm256_loadu_si256(pair + 1);
    const __m256 first0 = first_of(w0), first1 = first_of(w1), second0 = second_of(w0), second1 = second_of(w1);
    K25_ROW(0) K25_ROW(1) K25_ROW(2) K25_ROW(3) K25_ROW(4)
  }
  K25_STORE(0) K25_STORE(1) K25_STORE(2) K25_STORE(3) K25_STORE(4)
}
#undef K25_ROW
#undef K25_STORE

void tile_of(int64_t rows, const float* x, int64_t k, const uint32_t* block, const uint16_t* bias, uint16_t* out, int64_t out_stride) {
  switch (rows) {
#define K25_TILE(R) \
  case R: return tile<R>(x, k, block, bias, out, out_stride);
    K25_TILE(1) K25_TILE(2) K25_TILE(3) K25_TILE(4) K25_TILE(5)
#undef K25_TILE
  }
}

// From this many rows on, the weight is widened to a float32 [K, N] copy for the call and
// multiplied by torch's float32 GEMM (MKL), which reaches 150-170 GFLOP/s on this project's
// 2-core AVX2 machine where the register tiles above reach ~110; the copy costs ~4% of a
// 512-row call. Below it, the tiles win: they read half the bytes and widen nothing.
constexpr int64_t kWidenRows = 128;

// Rows below kWidenRows: x widened, the register tiles over the blocked weights
void tiled(const uint16_t* x, int64_t rows, int64_t k, const uint32_t* w, int64_t blocks, const uint16_t* bias, uint16_t* out,
           int threads) {
  std::vector<float> widened(rows * k);
  const int64_t n = blocks * 16;
  const int64_t chunk_rows = std::max<int64_t>(kTileRows, kChunkFloats / k / kTileRows * kTileRows);
#pragma omp parallel num_threads(threads) if (blocks * k * rows > 8192)
  {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rows * k / 8; ++i) _mm256_storeu_ps(widened.data() + 8 * i, widen8(x + 8 * i));
#pragma omp single
    for (int64_t i = rows * k / 8 * 8; i < rows * k; ++i) widened[i] = c10::BFloat16(x[i], c10::BFloat16::from_bits());
    // the same blocks for a thread in every chunk (static schedule), so each stays in its cache
    for (int64_t first_row = 0; first_row < rows; first_row += chunk_rows) {
      const int64_t last_row = std::min(rows, first_row + chunk_rows);
#pragma omp for schedule(static) nowait
      for (int64_t b = 0; b < blocks; ++b) {
        const uint32_t* block = w + b * (k / 2) * 16;
        for (int64_t r = first_row; r < last_row; r += kTileRows)
          tile_of(std::min<int64_t>(kTileRows, last_row - r), widened.data() + r * k, k, block, bias ? bias + b * 16 : nullptr,
                  out + r * n + b * 16, n);
      }
    }
  }
}

// The blocked weights as float32 W^T [K, N]: pair p of block b holds rows 2p and 2p + 1 of its 16 columns
at::Tensor widened_weight(const at::Tensor& blocked) {
  const int64_t blocks = blocked.size(0), pairs = blocked.size(1), n = blocks * 16;
  auto weight = at::empty({2 * pairs, n}, blocked.options().dtype(at::kFloat));
  const auto* w = reinterpret_cast<const __m256i*>(blocked.data_ptr());
  float* out = weight.data_ptr<float>();
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      for (int64_t p = 0; p < pairs; ++p)
        for (int64_t half = 0; half < 2; ++half) {
          const __m256i v = _mm256_loadu_si256(w + (b * pairs + p) * 2 + half);
          float* column = out + 2 * p * n + 16 * b + 8 * half;
          _mm256_storeu_ps(column, first_of(v));
          _mm256_storeu_ps(column + n, second_of(v));
        }
  });
  return weight;
}

}  // namespace

bool has_avx2_linear() { return true; }

at::Tensor linear_avx2(const at::Tensor& x, const at::Tensor& blocked, const c10::optional<at::Tensor>& bias) {
  const int64_t rows = x.size(0), blocks = blocked.size(0), k = 2 * blocked.size(1);
  if (rows >= kWidenRows) {
    const auto x32 = x.to(at::kFloat), weight = widened_weight(blocked);
    return (bias ? at::addmm(bias->to(at::kFloat), x32, weight) : at::mm(x32, weight)).to(at::kBFloat16);
  }
  auto out = at::empty({rows, blocks * 16}, x.options());
  tiled(reinterpret_cast<const uint16_t*>(x.data_ptr()), rows, k, reinterpret_cast<const uint32_t*>(blocked.data_ptr()), blocks,
        bias ? reinterpret_cast<const uint16_t*>(bias->data_ptr()) : nullptr, reinterpret_cast<uint16_t*>(out.data_ptr()),
        at::get_num_threads());
  return out;
}
#else
bool has_avx2_linear() { return false; }

at::Tensor linear_avx2(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&) {
  TORCH_CHECK(false, "linear_avx2: this build has no AVX2");
}
#endif
