// Paged attention on a CPU for a whole step (prefill slices and decodes): each query row reads
// its context's K/V rows in place through its block table (no gather into a scratch buffer),
// scores, softmax and the weighted sum of V in fp32, one task per (query row, KV head) with
// that head's query heads together, so every K/V row is read once for the whole GQA group.
// With AVX512-BF16 (bf16 caches) both products run as bf16 pair products summed in fp32 (the
// probabilities rounded to bf16); float32 caches, and bf16 ones without AVX512-BF16, run in
// float32 with AVX2; the rest (float16, other CPUs) take plain loops the compiler vectorises.
// Prefill slices attend as tiles (below): in bf16 on a CPU with AVX512-BF16, their two products
// on AMX where the CPU has it (attention_amx.cpp; its figures against the AVX512-BF16 tiles are on
// the benchmarks page of the docs); in float32 with AVX2 elsewhere (float32 caches, or no AVX512-BF16).
// Built by engine/kernels/cpu_build.py once per instruction set (generic, AVX2, AVX512-BF16, AMX).
#include "aten_parts.h"

#include "amx.h"
#include "cpu_math.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace {

using k25::exp_nonpositive;
using k25::to_float;

// s[0..n) <- exp(s - max s), in place; returns their sum (a softmax before its division) and
// sets `max` to max s when given
inline float exp_shifted(float* s, int64_t n, float* max = nullptr) {
  float m = s[0];
  for (int64_t pos = 1; pos < n; ++pos) m = std::max(m, s[pos]);
  if (max) *max = m;
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t pos = 0; pos < n; ++pos) {
    s[pos] = exp_nonpositive(s[pos] - m);
    sum += s[pos];
  }
  return sum;
}

// A sequence's context rows in one KV head of the cache: row(pos) is position pos's K (or V)
// row, found through the block table once per task rather than once per read.
template <typename T>
struct PagedRows {
  const T* head;  // this KV head's rows in the cache
  const int64_t* offsets;  // element offset of each position's row within a head
  const T* row(int64_t pos) const { return head + offsets[pos]; }
};

// Rows `from` .. `to` (clamped to `length`) asked into L1 ahead of use: a context's rows are
// contiguous only within a block, so the hardware prefetcher misses at every block boundary
// and a decode, whose K/V come from memory, would wait a memory latency per block.
constexpr int64_t kPrefetchRows = 32;
template <typename T>
inline void prefetch_rows(const PagedRows<T>& rows, int64_t from, int64_t to, int64_t length, int64_t dim) {
  for (int64_t pos = from; pos < std::min(to, length); ++pos) {
    const char* row = reinterpret_cast<const char*>(rows.row(pos));
    for (int64_t byte = 0; byte < dim * static_cast<int64_t>(sizeof(T)); byte += 64) __builtin_prefetch(row + byte, 0, 3);
  }
}

inline void row_offsets(std::vector<int64_t>& offsets, const int32_t* table, int64_t length, int64_t block_size, int64_t dim) {
  offsets.resize(length);
  for (int64_t first = 0, i = 0; first < length; first += block_size, ++i) {
    const int64_t base = static_cast<int64_t>(table[i]) * block_size * dim;
    for (int64_t r = 0; r < block_size && first + r < length; ++r) offsets[first + r] = base + r * dim;
  }
}

// scores[g][pos] = scale * q_g . k_pos for the group's query heads, any dtype.
template <typename T>
void score_rowwise(float* scores, const T* q, const PagedRows<T>& keys, int64_t group, int64_t length, int64_t dim, float scale) {
  std::vector<float> query(group * dim);
  for (int64_t i = 0; i < group * dim; ++i) query[i] = to_float(q[i]);
  for (int64_t pos = 0; pos < length; ++pos) {
    const T* key = keys.row(pos);
    for (int64_t g = 0; g < group; ++g) {
      const float* qg = query.data() + g * dim;
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t d = 0; d < dim; ++d) s += qg[d] * to_float(key[d]);
      scores[g * length + pos] = s * scale;
    }
  }
}

// acc[g] = sum over positions of probs[g][pos] * v_pos, any dtype.
template <typename T>
void weigh_rowwise(float* acc, const float* probs, const PagedRows<T>& values, int64_t group, int64_t length, int64_t dim) {
  std::fill(acc, acc + group * dim, 0.f);
  for (int64_t pos = 0; pos < length; ++pos) {
    const T* value = values.row(pos);
    for (int64_t g = 0; g < group; ++g) {
      const float p = probs[g * length + pos];
      float* ag = acc + g * dim;
#pragma omp simd
      for (int64_t d = 0; d < dim; ++d) ag[d] += p * to_float(value[d]);
    }
  }
}

#if defined(__AVX2__) && defined(__FMA__)
// Float32 and bf16 caches with AVX2, where the AVX512-BF16 paths below do not take them (float32
// anywhere, bf16 without AVX512-BF16): q.k as 8 positions' dot products for one query head at a
// time, reduced together; p.v with a G x C block of accumulators (query heads by 8-dim
// vectors) in registers, each V row's C vectors widened once a pass (the row-wise loops above
// reduce every dot product on its own, and load and store p.v's accumulators at every position).
template <typename T>
constexpr bool avx2_rows_take = std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>;
inline bool avx2_rows_apply(int64_t dim, int64_t group) { return dim % 8 == 0 && dim <= 256 && group <= 8; }

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) { return k25::widen8(p); }

// lane i of the result = the sum of the 8 lanes of v[i]
inline __m256 sum_each8(const __m256* v) {
  const __m256 low = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 high = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(low, high, 0x20), _mm256_permute2f128_ps(low, high, 0x31));
}

template <typename T>
void score_avx2(float* scores, const T* q, const PagedRows<T>& keys, int64_t group, int64_t length, int64_t dim, float scale) {
  float query[8 * 256];
  for (int64_t i = 0; i < group * dim; ++i) query[i] = to_float(q[i]);
  const __m256 scaled = _mm256_set1_ps(scale);
  prefetch_rows(keys, 0, kPrefetchRows, length, dim);
  for (int64_t first = 0; first < length; first += 8) {
    prefetch_rows(keys, first + kPrefetchRows, first + kPrefetchRows + 8, length, dim);
    const int64_t count = std::min<int64_t>(8, length - first);
    const T* rows[8];  // a last chunk shorter than 8 reads its last row again; those lanes are dropped
    for (int64_t i = 0; i < 8; ++i) rows[i] = keys.row(first + std::min(i, count - 1));
    for (int64_t g = 0; g < group; ++g) {
      __m256 dots[8];
      for (int i = 0; i < 8; ++i) dots[i] = _mm256_setzero_ps();
      for (int64_t d = 0; d < dim; d += 8) {
        const __m256 query_part = _mm256_loadu_ps(query + g * dim + d);
        for (int i = 0; i < 8; ++i) dots[i] = _mm256_fmadd_ps(query_part, load8(rows[i] + d), dots[i]);
      }
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, _mm256_mul_ps(sum_each8(dots), scaled));
      std::copy(lanes, lanes + count, scores + g * length + first);
    }
  }
}

// G probability rows (`prob_stride` apart) times V's rows row_of(0) .. row_of(length - 1)
// (float32 or bf16), columns column .. column + 8 C, into G rows of `acc` `acc_stride` apart
template <int G, int C, typename RowOf>
void weigh_block(float* acc, int64_t acc_stride, const float* probs, int64_t prob_stride, RowOf row_of, int64_t length,
                 int64_t column) {
  __m256 sums[G][C];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) sums[g][c] = _mm256_setzero_ps();
  for (int64_t pos = 0; pos < length; ++pos) {
    const auto* row = row_of(pos) + column;
    __m256 value[C];
    for (int c = 0; c < C; ++c) value[c] = load8(row + 8 * c);
    for (int g = 0; g < G; ++g) {
      const __m256 p = _mm256_broadcast_ss(probs + g * prob_stride + pos);
      for (int c = 0; c < C; ++c) sums[g][c] = _mm256_fmadd_ps(p, value[c], sums[g][c]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(acc + g * acc_stride + column + 8 * c, sums[g][c]);
}

// columns column .. column + 8 C of a decode's p.v for G query heads, its V rows in the cache
template <typename T, int G, int C>
void weigh_columns_avx2(float* acc, const float* probs, const PagedRows<T>& values, int64_t length, int64_t dim, int64_t column) {
  const bool prefetch = column == 0;  // later passes find the rows in cache
  if (prefetch) prefetch_rows(values, 0, kPrefetchRows, length, dim);
  auto row_of = [&](int64_t pos) {
    if (prefetch) prefetch_rows(values, pos + kPrefetchRows, pos + kPrefetchRows + 1, length, dim);
    return values.row(pos);
  };
  weigh_block<G, C>(acc, dim, probs, length, row_of, length, column);
}

template <typename T>
void weigh_avx2(float* acc, const float* probs, const PagedRows<T>& values, int64_t group, int64_t length, int64_t dim) {
  using Pass = void (*)(float*, const float*, const PagedRows<T>&, int64_t, int64_t, int64_t);
  // by query heads: the widest pass whose accumulators and row vectors fit AVX2's 16 registers
  static constexpr Pass wide[] = {nullptr, weigh_columns_avx2<T, 1, 4>, weigh_columns_avx2<T, 2, 4>, weigh_columns_avx2<T, 3, 2>,
                                  weigh_columns_avx2<T, 4, 2>, weigh_columns_avx2<T, 5, 2>, weigh_columns_avx2<T, 6, 2>,
                                  weigh_columns_avx2<T, 7, 1>, weigh_columns_avx2<T, 8, 1>};
  static constexpr int64_t wide_columns[] = {0, 32, 32, 16, 16, 16, 16, 8, 8};
  static constexpr Pass narrow[] = {nullptr, weigh_columns_avx2<T, 1, 1>, weigh_columns_avx2<T, 2, 1>, weigh_columns_avx2<T, 3, 1>,
                                    weigh_columns_avx2<T, 4, 1>, weigh_columns_avx2<T, 5, 1>, weigh_columns_avx2<T, 6, 1>,
                                    weigh_columns_avx2<T, 7, 1>, weigh_columns_avx2<T, 8, 1>};
  for (int64_t column = 0; column < dim;) {
    if (column + wide_columns[group] <= dim) {
      wide[group](acc, probs, values, length, dim, column);
      column += wide_columns[group];
    } else {
      narrow[group](acc, probs, values, length, dim, column);
      column += 8;
    }
  }
}
#endif

// the fastest of the paths above that takes these sizes and dtype
template <typename T>
void score_vectorised(float* scores, const T* q, const PagedRows<T>& keys, int64_t group, int64_t length, int64_t dim, float scale) {
#if defined(__AVX2__) && defined(__FMA__)
  if constexpr (avx2_rows_take<T>) {
    if (avx2_rows_apply(dim, group)) return score_avx2(scores, q, keys, group, length, dim, scale);
  }
#endif
  score_rowwise(scores, q, keys, group, length, dim, scale);
}

template <typename T>
void weigh_vectorised(float* acc, const float* probs, const PagedRows<T>& values, int64_t group, int64_t length, int64_t dim) {
#if defined(__AVX2__) && defined(__FMA__)
  if constexpr (avx2_rows_take<T>) {
    if (avx2_rows_apply(dim, group)) return weigh_avx2(acc, probs, values, group, length, dim);
  }
#endif
  weigh_rowwise(acc, probs, values, group, length, dim);
}

template <typename T>
void score(float* scores, const T* q, const PagedRows<T>& keys, int64_t group, int64_t length, int64_t dim, float scale) {
  score_vectorised(scores, q, keys, group, length, dim, scale);
}

template <typename T>
void weigh(float* acc, const float* probs, const PagedRows<T>& values, int64_t group, int64_t length, int64_t dim) {
  weigh_vectorised(acc, probs, values, group, length, dim);
}

#if defined(__AVX512BF16__)
// lane i of the result = the sum of the 16 lanes of v[i]
inline __m512 sum_each(const __m512* v) {
  __m512 pairs[8], quads[4];
  for (int i = 0; i < 8; ++i)
    pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)
    quads[i] = _mm512_add_ps(_mm512_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], 0xEE));
  const __m512 low = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], 0x88), _mm512_shuffle_f32x4(quads[0], quads[1], 0xDD));
  const __m512 high = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], 0x88), _mm512_shuffle_f32x4(quads[2], quads[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(low, high, 0x88), _mm512_shuffle_f32x4(low, high, 0xDD));
}

// bf16 with head_dim WORDS x 32: products of bf16 pairs summed in fp32 (AVX512-BF16), 16
// positions' dot products reduced together. A last chunk shorter than 16 reads its last row
// again in the lanes past the end, whose scores the masked store drops.
template <int WORDS>
void score_words(float* scores, const c10::BFloat16* q, const PagedRows<c10::BFloat16>& keys, int64_t group,
                 int64_t length, int64_t dim, float scale) {
  const __m512 scaled = _mm512_set1_ps(scale);
  __m512bh query[8][WORDS];
  for (int64_t g = 0; g < group; ++g)
    for (int w = 0; w < WORDS; ++w) query[g][w] = (__m512bh)_mm512_loadu_si512(q + g * dim + w * 32);
  prefetch_rows(keys, 0, kPrefetchRows, length, dim);
  for (int64_t first = 0; first < length; first += 16) {
    prefetch_rows(keys, first + kPrefetchRows, first + kPrefetchRows + 16, length, dim);
    const int64_t count = std::min<int64_t>(16, length - first);
    const __mmask16 valid = static_cast<__mmask16>((1u << count) - 1);
    const c10::BFloat16* rows[16];
    for (int64_t i = 0; i < 16; ++i) rows[i] = keys.row(first + std::min(i, count - 1));
    for (int64_t g = 0; g < group; ++g) {  // the chunk's 16 K rows stay in L1 across the group
      __m512 dots[16];
      for (int i = 0; i < 16; ++i) {
        __m512 dot = _mm512_setzero_ps();
        for (int w = 0; w < WORDS; ++w) dot = _mm512_dpbf16_ps(dot, query[g][w], (__m512bh)_mm512_loadu_si512(rows[i] + w * 32));
        dots[i] = dot;
      }
      _mm512_mask_storeu_ps(scores + g * length + first, valid, _mm512_mul_ps(sum_each(dots), scaled));
    }
  }
}

template <>
void score<c10::BFloat16>(float* scores, const c10::BFloat16* q, const PagedRows<c10::BFloat16>& keys, int64_t group,
                          int64_t length, int64_t dim, float scale) {
  using Words = void (*)(float*, const c10::BFloat16*, const PagedRows<c10::BFloat16>&, int64_t, int64_t, int64_t, float);
  static constexpr Words by_words[] = {score_words<1>, score_words<2>, score_words<3>, score_words<4>,
                                       score_words<5>, score_words<6>, score_words<7>, score_words<8>};
  if (dim % 32 != 0 || dim > 256 || group > 8) return score_vectorised(scores, q, keys, group, length, dim, scale);
  by_words[dim / 32 - 1](scores, q, keys, group, length, dim, scale);
}
#endif

#if defined(__AVX512BF16__)
// p.v with bf16 V, positions taken two at a time: rows pos and pos + 1 interleave into 32-bit
// (v[pos][d], v[pos + 1][d]) words, so that one vdpbf16ps against the broadcast pair
// (p[pos], p[pos + 1]) adds both positions' terms for 16 dims; the probabilities are rounded
// to bf16 for it, as the prefill tiles round them. W words of 32 dims a pass, for G query heads:
// 4 W G accumulators in registers. Within a word, the low interleave holds dims 0-3, 8-11,
// 16-19, 24-27 and the high one the others, put back in order at the end.
template <int G, int W>
void weigh_pairs(float* acc, const uint32_t* prob_pairs, int64_t pair_stride, const PagedRows<c10::BFloat16>& values,
                 int64_t length, int64_t dim, int64_t first_word) {
  __m512 low[G][W], high[G][W];
  for (int g = 0; g < G; ++g)
    for (int w = 0; w < W; ++w) low[g][w] = high[g][w] = _mm512_setzero_ps();
  auto add = [&](int64_t pair, const c10::BFloat16* even, const c10::BFloat16* odd) {
    for (int w = 0; w < W; ++w) {
      const __m512i a = _mm512_loadu_si512(even + (first_word + w) * 32);
      const __m512i b = odd ? _mm512_loadu_si512(odd + (first_word + w) * 32) : _mm512_setzero_si512();
      const __m512bh lo = (__m512bh)_mm512_unpacklo_epi16(a, b), hi = (__m512bh)_mm512_unpackhi_epi16(a, b);
      for (int g = 0; g < G; ++g) {
        const __m512bh p = (__m512bh)_mm512_set1_epi32(prob_pairs[g * pair_stride + pair]);
        low[g][w] = _mm512_dpbf16_ps(low[g][w], lo, p);
        high[g][w] = _mm512_dpbf16_ps(high[g][w], hi, p);
      }
    }
  };
  const bool prefetch = first_word == 0;  // later passes find the rows in cache
  if (prefetch) prefetch_rows(values, 0, kPrefetchRows, length, dim);
  int64_t pos = 0;
  for (; pos + 1 < length; pos += 2) {
    if (prefetch) prefetch_rows(values, pos + kPrefetchRows, pos + kPrefetchRows + 2, length, dim);
    add(pos / 2, values.row(pos), values.row(pos + 1));
  }
  if (pos < length) add(pos / 2, values.row(pos), nullptr);
  const __m512i first_half = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second_half = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int g = 0; g < G; ++g)
    for (int w = 0; w < W; ++w) {
      float* out = acc + g * dim + (first_word + w) * 32;
      _mm512_storeu_ps(out, _mm512_permutex2var_ps(low[g][w], first_half, high[g][w]));
      _mm512_storeu_ps(out + 16, _mm512_permutex2var_ps(low[g][w], second_half, high[g][w]));
    }
}

// bf16 V with head_dim a multiple of 32 and up to 8 query heads per KV head
template <>
void weigh<c10::BFloat16>(float* acc, const float* probs, const PagedRows<c10::BFloat16>& values, int64_t group,
                          int64_t length, int64_t dim) {
  using Pass = void (*)(float*, const uint32_t*, int64_t, const PagedRows<c10::BFloat16>&, int64_t, int64_t, int64_t);
  static constexpr Pass one_word[] = {nullptr, weigh_pairs<1, 1>, weigh_pairs<2, 1>, weigh_pairs<3, 1>, weigh_pairs<4, 1>,
                                      weigh_pairs<5, 1>, weigh_pairs<6, 1>, weigh_pairs<7, 1>, weigh_pairs<8, 1>};
  static constexpr Pass two_words[] = {nullptr, weigh_pairs<1, 2>, weigh_pairs<2, 2>, weigh_pairs<3, 2>, weigh_pairs<4, 2>};
  if (dim % 32 != 0 || group > 8) return weigh_vectorised(acc, probs, values, group, length, dim);
  // each query head's probabilities as bf16 pairs (position 2 j in the low half), zero past the end
  const int64_t pairs = (length + 1) / 2, pair_stride = (pairs + 15) / 16 * 16;
  thread_local std::vector<uint32_t> prob_pairs;  // every entry written below
  prob_pairs.resize(group * pair_stride);
  for (int64_t g = 0; g < group; ++g) {
    const float* p = probs + g * length;
    uint32_t* out = prob_pairs.data() + g * pair_stride;
    for (int64_t pos = 0; pos < 2 * pair_stride; pos += 32) {
      auto part = [&](int64_t from) {
        const int64_t n = std::clamp<int64_t>(length - from, 0, 16);
        return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), p + from);
      };
      _mm512_storeu_si512(out + pos / 2, (__m512i)_mm512_cvtne2ps_pbh(part(pos + 16), part(pos)));
    }
  }
  const int64_t words = dim / 32;
  for (int64_t word = 0; word < words;) {
    if (group <= 4 && word + 2 <= words) {
      two_words[group](acc, prob_pairs.data(), pair_stride, values, length, dim, word);
      word += 2;
    } else {
      one_word[group](acc, prob_pairs.data(), pair_stride, values, length, dim, word);
      word += 1;
    }
  }
}
#endif

#if defined(__AVX512BF16__)
// Prefill slices in bf16 attend as tiles: a tile's query rows (all their group's heads: the
// tile's "query vectors") against its sequence's context, both products as bf16 pair dot
// products summed in fp32, with K and V repacked once per (sequence, KV head) so that each
// packed vector serves every query vector of every tile (the per-row path reads each K row
// once per query row and reduces 16 dot products across lanes). The probabilities are rounded
// to bf16 before p.v, as FlashAttention and torch's CPU SDPA do.
struct PackedContext {
  // keys[(tile * dim / 2 + pair) * 16 + lane]: key 16 * tile + lane's dims 2 pair, 2 pair + 1
  std::vector<uint32_t> keys;
  // values[(pair * dim / 16 + column) * 16 + lane]: keys 2 pair and 2 pair + 1 at dim 16 column + lane
  std::vector<uint32_t> values;
};

inline bool tiles_apply(int64_t dim) { return dim % 32 == 0 && dim <= 256; }

void pack_context(PackedContext& packed, const PagedRows<c10::BFloat16>& keys, const PagedRows<c10::BFloat16>& values,
                  int64_t length, int64_t dim) {
  const int64_t pairs = dim / 2, tiles = (length + 15) / 16, key_pairs = (length + 1) / 2, columns = dim / 16;
  packed.keys.assign(tiles * pairs * 16, 0u);
  for (int64_t pos = 0; pos < length; ++pos) {
    const uint32_t* row = reinterpret_cast<const uint32_t*>(keys.row(pos));
    uint32_t* tile = packed.keys.data() + (pos / 16) * pairs * 16 + pos % 16;
    for (int64_t p = 0; p < pairs; ++p) tile[p * 16] = row[p];
  }
  // whole tiles of 16 pairs for AMX's p.v, zero past the last key (probabilities there are zero,
  // but zero times a stale NaN would not be)
  const int64_t padded_pairs = (key_pairs + 15) / 16 * 16;
  packed.values.resize(padded_pairs * columns * 16);
  std::fill(packed.values.begin() + key_pairs * columns * 16, packed.values.end(), 0u);
  for (int64_t pair = 0; pair < key_pairs; ++pair) {
    const uint16_t* even = reinterpret_cast<const uint16_t*>(values.row(2 * pair));
    const uint16_t* odd = 2 * pair + 1 < length ? reinterpret_cast<const uint16_t*>(values.row(2 * pair + 1)) : nullptr;
    uint32_t* out = packed.values.data() + pair * columns * 16;
    for (int64_t d = 0; d < dim; ++d) out[d] = even[d] | (odd ? static_cast<uint32_t>(odd[d]) << 16 : 0u);
  }
}

struct TileScratch {
  std::vector<float> scores;  // [query vector][positions]
  std::vector<uint16_t> probs;  // bf16 bits, [query vector][positions rounded up to 32], zero past each one's length
  std::vector<uint16_t> queries;  // AMX: the tile's query vectors gathered, [vectors rounded up to 16][dim]
  std::vector<float> acc;  // AMX: p.v, [vectors rounded up to 16][dim]
};

// The tile's softmax: over each query vector's own positions (vector j = row * group + g sees
// base + row of them), rounded to bf16, zero past them up to prob_stride.
void tile_probabilities(TileScratch& scratch, int64_t vectors, int64_t stride, int64_t prob_stride, int64_t base, int64_t group) {
  for (int64_t j = 0; j < vectors; ++j) {
    float* s = scratch.scores.data() + j * stride;
    uint16_t* p = scratch.probs.data() + j * prob_stride;
    const int64_t seen = base + j / group;
    const __m512 inv = _mm512_set1_ps(1.f / exp_shifted(s, seen));
    for (int64_t pos = 0; pos < prob_stride; pos += 16) {  // zero past `seen`: p.v reads whole pairs
      const __mmask16 valid = pos >= seen ? 0 : seen - pos >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (seen - pos)) - 1);
      const __m512 weights = _mm512_mul_ps(_mm512_maskz_loadu_ps(valid, s + pos), inv);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + pos), (__m256i)_mm512_cvtneps_pbh(weights));
    }
  }
}

// The tile's query vectors j = row * group + g (row r of the tile sees base + r positions).
// COLUMNS = dim / 16; the p.v accumulators of BLOCK query vectors stay in registers.
template <int COLUMNS>
void attend_tile(c10::BFloat16* out, const c10::BFloat16* q, const PackedContext& packed, TileScratch& scratch,
                 int64_t first_row, int64_t rows, int64_t heads, int64_t head, int64_t group, int64_t base, float scale) {
  constexpr int64_t dim = COLUMNS * 16, pairs = dim / 2;
  constexpr int BLOCK = COLUMNS >= 24 ? 1 : 24 / COLUMNS;
  const int64_t vectors = rows * group, longest = base + rows - 1;
  const int64_t stride = (longest + 15) / 16 * 16;  // a score row: whole key tiles
  const int64_t prob_stride = (longest + 31) / 32 * 32;  // whole pairs, whole AMX tiles (as the AMX path reads them)
  scratch.scores.resize(vectors * stride);
  scratch.probs.resize(vectors * prob_stride);
  auto query = [&](int64_t j) { return q + ((first_row + j / group) * heads + head * group + j % group) * dim; };
  auto length = [&](int64_t j) { return base + j / group; };
  const __m512 scaled = _mm512_set1_ps(scale);
  static const uint32_t zeros[pairs] = {};
  for (int64_t j0 = 0; j0 < vectors; j0 += 8) {  // q.k: 8 query vectors against each packed key tile
    const int64_t count = std::min<int64_t>(8, vectors - j0);
    const uint32_t* qs[8];
    for (int64_t i = 0; i < 8; ++i) qs[i] = i < count ? reinterpret_cast<const uint32_t*>(query(j0 + i)) : zeros;
    const int64_t seen = length(j0 + count - 1);
    const int64_t tiles = (seen + 15) / 16;
    for (int64_t tile = 0; tile < tiles; tile += 2) {  // two key tiles a pass: each broadcast serves 32 keys
      const uint32_t* keys = packed.keys.data() + tile * pairs * 16;
      const uint32_t* next = tile + 1 < tiles ? keys + pairs * 16 : keys;  // an odd last tile: itself again
      __m512 acc[8], acc_next[8];
      for (int i = 0; i < 8; ++i) acc[i] = acc_next[i] = _mm512_setzero_ps();
      for (int64_t p = 0; p < pairs; ++p) {
        const __m512bh k = (__m512bh)_mm512_loadu_si512(keys + p * 16), k_next = (__m512bh)_mm512_loadu_si512(next + p * 16);
        for (int i = 0; i < 8; ++i) {
          const __m512bh qp = (__m512bh)_mm512_set1_epi32(qs[i][p]);
          acc[i] = _mm512_dpbf16_ps(acc[i], qp, k);
          acc_next[i] = _mm512_dpbf16_ps(acc_next[i], qp, k_next);
        }
      }
      for (int64_t i = 0; i < count; ++i) {
        float* row = scratch.scores.data() + (j0 + i) * stride + tile * 16;
        _mm512_storeu_ps(row, _mm512_mul_ps(acc[i], scaled));
        if (tile + 1 < tiles) _mm512_storeu_ps(row + 16, _mm512_mul_ps(acc_next[i], scaled));
      }
    }
  }
  tile_probabilities(scratch, vectors, stride, prob_stride, base, group);
  for (int64_t j0 = 0; j0 < vectors; j0 += BLOCK) {  // p.v: BLOCK vectors x COLUMNS accumulators
    const int64_t count = std::min<int64_t>(BLOCK, vectors - j0);
    const uint32_t* ps[BLOCK];
    for (int64_t i = 0; i < BLOCK; ++i) ps[i] = reinterpret_cast<const uint32_t*>(scratch.probs.data() + (j0 + std::min(i, count - 1)) * prob_stride);
    __m512 acc[BLOCK][COLUMNS];
    for (int i = 0; i < BLOCK; ++i)
      for (int c = 0; c < COLUMNS; ++c) acc[i][c] = _mm512_setzero_ps();
    const int64_t key_pairs = (length(j0 + count - 1) + 1) / 2;
    for (int64_t pair = 0; pair < key_pairs; ++pair) {
      __m512bh v[COLUMNS];
      for (int c = 0; c < COLUMNS; ++c) v[c] = (__m512bh)_mm512_loadu_si512(packed.values.data() + (pair * COLUMNS + c) * 16);
      for (int i = 0; i < BLOCK; ++i) {
        const __m512bh p = (__m512bh)_mm512_set1_epi32(ps[i][pair]);
        for (int c = 0; c < COLUMNS; ++c) acc[i][c] = _mm512_dpbf16_ps(acc[i][c], p, v[c]);
      }
    }
    for (int64_t i = 0; i < count; ++i) {
      c10::BFloat16* o = out + (query(j0 + i) - q);
      for (int c = 0; c < COLUMNS; ++c)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + c * 16), (__m256i)_mm512_cvtneps_pbh(acc[i][c]));
    }
  }
}

using TileKernel = void (*)(c10::BFloat16*, const c10::BFloat16*, const PackedContext&, TileScratch&, int64_t, int64_t,
                            int64_t, int64_t, int64_t, int64_t, float);
constexpr TileKernel tile_kernels[] = {attend_tile<2>, attend_tile<4>, attend_tile<6>, attend_tile<8>,
                                       attend_tile<10>, attend_tile<12>, attend_tile<14>, attend_tile<16>};

#if defined(K25_AMX)
// The same tile with both products on AMX (attention_amx.cpp): the query vectors gathered into
// whole 16-row tiles, every key tile up to the tile's last row scored (its earlier rows' extra
// positions are a few of the context's and masked by the softmax).
void attend_tile_amx(c10::BFloat16* out, const c10::BFloat16* q, const PackedContext& packed, TileScratch& scratch,
                     int64_t first_row, int64_t rows, int64_t heads, int64_t head, int64_t group, int64_t base, float scale,
                     int64_t dim) {
  const int64_t vectors = rows * group, padded = (vectors + 15) / 16 * 16, longest = base + rows - 1;
  const int64_t stride = (longest + 15) / 16 * 16, prob_stride = (longest + 31) / 32 * 32;
  auto vector_offset = [&](int64_t j) { return ((first_row + j / group) * heads + head * group + j % group) * dim; };
  scratch.queries.resize(padded * dim);
  for (int64_t j = 0; j < vectors; ++j) std::memcpy(scratch.queries.data() + j * dim, q + vector_offset(j), dim * 2);
  std::fill(scratch.queries.begin() + vectors * dim, scratch.queries.end(), 0);  // the last A tile's padding rows
  scratch.scores.resize(padded * stride);
  scratch.probs.resize(padded * prob_stride);
  scratch.acc.resize(padded * dim);
  attention_scores_amx(scratch.scores.data(), stride, scratch.queries.data(), vectors, packed.keys.data(), stride / 16, dim, scale);
  tile_probabilities(scratch, vectors, stride, prob_stride, base, group);
  attention_weigh_amx(scratch.acc.data(), scratch.probs.data(), prob_stride, vectors, packed.values.data(), prob_stride / 32, dim);
  for (int64_t j = 0; j < vectors; ++j) {
    c10::BFloat16* o = out + vector_offset(j);
    const float* a = scratch.acc.data() + j * dim;
    for (int64_t d = 0; d < dim; d += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + d), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(a + d)));
  }
}
#endif
#endif

#if defined(__AVX2__) && defined(__FMA__)
// Prefill slices that the bf16 tiles above do not take (float32 caches anywhere, bf16 ones on a
// CPU without AVX512-BF16) attend as tiles too, in float32: K packed transposed, 16 keys to a
// row per dim, so that 4 query vectors' scores against 16 keys are 8 accumulators fed by 2
// loads and 4 broadcasts per dim (the row-wise path reduces every dot product across lanes and
// reads each K row once per query row); V widened to float rows, and p.v runs 3 query vectors
// by 32 columns (12 accumulators, 4 loads and 3 broadcasts a position).
struct FloatContext {
  std::vector<float> keys;  // [(tile * dim + d) * 16 + lane]: key 16 tile + lane's dim d, zero past the last key
  std::vector<float> values;  // [pos * dim + d]
};

inline bool float_tiles_apply(int64_t dim) { return dim % 8 == 0 && dim <= 256; }

template <typename T>
void pack_float_context(FloatContext& packed, const PagedRows<T>& keys, const PagedRows<T>& values, int64_t length, int64_t dim) {
  packed.keys.assign((length + 15) / 16 * dim * 16, 0.f);
  packed.values.resize(length * dim);
  for (int64_t pos = 0; pos < length; ++pos) {
    const T* key = keys.row(pos);
    const T* value = values.row(pos);
    float* column = packed.keys.data() + (pos / 16) * dim * 16 + pos % 16;
    float* row = packed.values.data() + pos * dim;
    for (int64_t d = 0; d < dim; ++d) column[d * 16] = to_float(key[d]);
    for (int64_t d = 0; d < dim; ++d) row[d] = to_float(value[d]);
  }
}

struct FloatScratch {
  std::vector<float> queries;  // the tile's query vectors, scaled, [vectors rounded up to 4][dim]
  std::vector<float> probs;  // [vectors rounded up to 4][positions rounded up to 16], zero past each one's own
};

// scores of 4 query vectors (dim floats apart) against 16 packed keys, into 4 rows `stride` apart
inline void score_4x16(float* scores, int64_t stride, const float* queries, const float* keys, int64_t dim) {
  __m256 low0 = _mm256_setzero_ps(), low1 = low0, low2 = low0, low3 = low0;
  __m256 high0 = low0, high1 = low0, high2 = low0, high3 = low0;
  for (int64_t d = 0; d < dim; ++d) {
    const __m256 low = _mm256_loadu_ps(keys + d * 16), high = _mm256_loadu_ps(keys + d * 16 + 8);
    const __m256 q0 = _mm256_broadcast_ss(queries + d), q1 = _mm256_broadcast_ss(queries + dim + d);
    const __m256 q2 = _mm256_broadcast_ss(queries + 2 * dim + d), q3 = _mm256_broadcast_ss(queries + 3 * dim + d);
    low0 = _mm256_fmadd_ps(q0, low, low0), high0 = _mm256_fmadd_ps(q0, high, high0);
    low1 = _mm256_fmadd_ps(q1, low, low1), high1 = _mm256_fmadd_ps(q1, high, high1);
    low2 = _mm256_fmadd_ps(q2, low, low2), high2 = _mm256_fmadd_ps(q2, high, high2);
    low3 = _mm256_fmadd_ps(q3, low, low3), high3 = _mm256_fmadd_ps(q3, high, high3);
  }
  _mm256_storeu_ps(scores, low0), _mm256_storeu_ps(scores + 8, high0);
  _mm256_storeu_ps(scores + stride, low1), _mm256_storeu_ps(scores + stride + 8, high1);
  _mm256_storeu_ps(scores + 2 * stride, low2), _mm256_storeu_ps(scores + 2 * stride + 8, high2);
  _mm256_storeu_ps(scores + 3 * stride, low3), _mm256_storeu_ps(scores + 3 * stride + 8, high3);
}

// The tile's query vectors j = row * group + g (row r of the tile sees base + r positions)
template <typename T>
void attend_tile_float(T* out, const T* q, const FloatContext& packed, FloatScratch& scratch, int64_t first_row, int64_t rows,
                       int64_t heads, int64_t head, int64_t group, int64_t base, float scale, int64_t dim) {
  const int64_t vectors = rows * group, padded = (vectors + 3) / 4 * 4 + 2;  // whole blocks of 4, and of 3
  const int64_t stride = (base + rows - 1 + 15) / 16 * 16;  // a probability row: whole key tiles
  auto query = [&](int64_t j) { return q + ((first_row + j / group) * heads + head * group + j % group) * dim; };
  auto seen = [&](int64_t j) { return base + std::min(j, vectors - 1) / group; };
  scratch.queries.assign(padded * dim, 0.f);
  for (int64_t j = 0; j < vectors; ++j)
    for (int64_t d = 0; d < dim; ++d) scratch.queries[j * dim + d] = to_float(query(j)[d]) * scale;
  scratch.probs.resize(padded * stride);
  for (int64_t j0 = 0; j0 < vectors; j0 += 4)
    for (int64_t tile = 0; tile < (seen(j0 + 3) + 15) / 16; ++tile)
      score_4x16(scratch.probs.data() + j0 * stride + tile * 16, stride, scratch.queries.data() + j0 * dim,
                 packed.keys.data() + tile * dim * 16, dim);
  for (int64_t j = 0; j < padded; ++j) {  // softmax over each vector's own positions, zero past them
    float* p = scratch.probs.data() + j * stride;
    const int64_t own = j < vectors ? seen(j) : 0;
    if (own > 0) {
      const float inv = 1.f / exp_shifted(p, own);
      for (int64_t pos = 0; pos < own; ++pos) p[pos] *= inv;
    }
    std::fill(p + own, p + stride, 0.f);
  }
  // p.v, into the query buffer (each block's queries are no longer needed)
  float* acc = scratch.queries.data();
  for (int64_t j0 = 0; j0 < vectors; j0 += 3) {
    const float* p = scratch.probs.data() + j0 * stride;
    const int64_t length = seen(j0 + 2);
    auto row_of = [&](int64_t pos) { return packed.values.data() + pos * dim; };
    int64_t column = 0;
    for (; column + 32 <= dim; column += 32) weigh_block<3, 4>(acc + j0 * dim, dim, p, stride, row_of, length, column);
    for (; column < dim; column += 8) weigh_block<3, 1>(acc + j0 * dim, dim, p, stride, row_of, length, column);
  }
  for (int64_t j = 0; j < vectors; ++j) {
    T* o = out + (query(j) - q);
    for (int64_t d = 0; d < dim; ++d) o[d] = static_cast<T>(acc[j * dim + d]);
  }
}
#endif

// One task: `rows` consecutive query rows of one sequence in one KV head (a tile of a prefill
// slice, or a single row), or part `part` of a single row's positions (split below).
struct Task {
  int64_t seq, first_row, rows, head;
  int64_t packed;  // its sequence's PackedContext (times kv_heads, plus head), or -1: row by row
  int64_t cost;  // query rows times positions seen, to start the dearest first
  int64_t part = 0, parts = 1, split = -1;  // split: its row's index among the split rows
};

// A step with fewer row tasks than 2 per thread (a decode at batch 1: one per KV head) leaves
// threads idle; each row's positions are then cut into parts, one task each, whose partial
// softmaxes are merged after (flash-decoding's split-K), into no part shorter than this.
constexpr int64_t kMinPartPositions = 128;

// One part's share of a row: for each query head of the group, the max score, the sum of
// exp(score - max) and the sum of exp(score - max) * v.
struct Partial {
  std::vector<float> max, sum, acc;
};

// Every query row of the batch: row i of sequence s (n_s rows this step, L_s tokens in context
// after it) sits at position L_s - n_s + i and attends to positions 0 .. that one (causal
// within the step's own rows; a decode is the case n_s = 1). Tasks are taken dearest first by
// whichever thread is free: a slice's causal rows differ in cost by up to its length.
template <typename T>
void attend(T* out, const T* q, const T* k_cache, const T* v_cache, const int32_t* block_tables,
            const int32_t* query_start, const int32_t* seq_lens, int64_t num_seqs, int64_t heads,
            int64_t kv_heads, int64_t slots, int64_t max_blocks, int64_t block_size, float scale, int64_t dim, bool amx) {
  const int64_t group = heads / kv_heads;
  auto rows_of = [&](int64_t s) -> int64_t { return query_start[s + 1] - query_start[s]; };
  constexpr bool bf16 = std::is_same_v<T, c10::BFloat16>;
#if defined(__AVX512BF16__)
  const bool bf16_tiles = bf16 && tiles_apply(dim);
#else
  const bool bf16_tiles = false;
#endif
#if defined(__AVX2__) && defined(__FMA__)
  const bool float_tiles = !bf16_tiles && float_tiles_apply(dim);
#else
  const bool float_tiles = false;
#endif
  const bool tiled = bf16_tiles || float_tiles;
  std::vector<Task> tasks;
  std::vector<int64_t> packed_seqs;  // the sequences attended as tiles, each packed once per KV head
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t n = rows_of(s), before = seq_lens[s] - n;
    if (tiled && n > 1 && before >= 0) {
      // a tile's scores stay within ~256 KB: fewer rows per tile in a longer context
      const int64_t per_tile = std::clamp<int64_t>(65536 / (group * std::max<int64_t>(seq_lens[s], 1)), 4, 32);
      for (int64_t r = 0; r < n; r += per_tile)
        for (int64_t h = 0; h < kv_heads; ++h) {
          const int64_t rows = std::min(per_tile, n - r);
          tasks.push_back({s, query_start[s] + r, rows, h, static_cast<int64_t>(packed_seqs.size()) * kv_heads + h,
                           rows * std::max<int64_t>(before + r + rows, 0)});
        }
      packed_seqs.push_back(s);
      continue;
    }
    for (int64_t r = 0; r < n; ++r)
      for (int64_t h = 0; h < kv_heads; ++h) tasks.push_back({s, query_start[s] + r, 1, h, -1, std::max<int64_t>(before + r + 1, 0)});
  }
  const int64_t threads = at::get_num_threads();
  std::vector<Task> split_first;  // each split row's first part, by the row's index
  std::vector<std::vector<Partial>> partials;  // each split row's parts' shares
  if (packed_seqs.empty() && static_cast<int64_t>(tasks.size()) < 2 * threads) {
    // the fewest parts that give every thread the same count: threads / gcd(tasks, threads)
    const int64_t parts = threads / std::gcd(static_cast<int64_t>(tasks.size()), threads);
    std::vector<Task> cut;
    for (const Task& task : tasks) {
      const int64_t row_parts = std::min(parts, task.cost / kMinPartPositions);
      if (row_parts < 2) {
        cut.push_back(task);
        continue;
      }
      const int64_t split = static_cast<int64_t>(split_first.size());
      for (int64_t part = 0; part < row_parts; ++part)
        cut.push_back({task.seq, task.first_row, 1, task.head, -1, task.cost / row_parts, part, row_parts, split});
      split_first.push_back(cut[cut.size() - row_parts]);
      partials.emplace_back(row_parts);
    }
    tasks.swap(cut);
  }
  const int64_t split_rows = static_cast<int64_t>(split_first.size());
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& a, const Task& b) { return a.cost > b.cost; });
  auto context = [&](int64_t s, int64_t h, std::vector<int64_t>& offsets) {
    row_offsets(offsets, block_tables + s * max_blocks, seq_lens[s], block_size, dim);
    return std::make_pair(PagedRows<T>{k_cache + h * slots * dim, offsets.data()}, PagedRows<T>{v_cache + h * slots * dim, offsets.data()});
  };
  // each tiled (sequence, KV head) context packed once, in parallel, by `pack`
  auto pack_all = [&](auto& contexts, auto pack) {
    at::parallel_for(0, static_cast<int64_t>(contexts.size()), 1, [&](int64_t begin, int64_t end) {
      std::vector<int64_t> offsets;
      for (int64_t i = begin; i < end; ++i) {
        const int64_t s = packed_seqs[i / kv_heads];
        const auto [keys, values] = context(s, i % kv_heads, offsets);
        pack(contexts[i], keys, values, seq_lens[s], dim);
      }
    });
  };
#if defined(__AVX512BF16__)
  std::vector<PackedContext> packed(bf16_tiles ? packed_seqs.size() * kv_heads : 0);
  if constexpr (bf16) pack_all(packed, [](auto&... args) { pack_context(args...); });
#endif
#if defined(__AVX2__) && defined(__FMA__)
  std::vector<FloatContext> float_packed(float_tiles ? packed_seqs.size() * kv_heads : 0);
  pack_all(float_packed, [](auto&... args) { pack_float_context(args...); });
#endif
  const int64_t task_count = static_cast<int64_t>(tasks.size());
#pragma omp parallel num_threads(at::get_num_threads()) if (task_count > 1)
  {
    std::vector<float> scores, acc(group * dim), inverse_sum(group);
    std::vector<int64_t> offsets;
    int64_t offsets_for = -1;  // the sequence `offsets` holds rows of
#if defined(__AVX512BF16__)
    TileScratch scratch;
#endif
#if defined(__AVX2__) && defined(__FMA__)
    FloatScratch float_scratch;
#endif
#pragma omp for schedule(dynamic, 1)
    for (int64_t index = 0; index < task_count; ++index) {
      const Task& task = tasks[index];
      const int64_t s = task.seq, h = task.head;
      const int64_t before = seq_lens[s] - rows_of(s);  // positions before the slice's first row
#if defined(__AVX2__) && defined(__FMA__)
      if (float_tiles && task.packed >= 0) {
        attend_tile_float(out, q, float_packed[task.packed], float_scratch, task.first_row, task.rows, heads, h, group,
                          before + (task.first_row - query_start[s]) + 1, scale, dim);
        continue;
      }
#endif
#if defined(__AVX512BF16__)
      if constexpr (bf16) {
        if (task.packed >= 0) {
          const int64_t base = before + (task.first_row - query_start[s]) + 1;
#if defined(K25_AMX)
          if (amx) {
            attend_tile_amx(out, q, packed[task.packed], scratch, task.first_row, task.rows, heads, h, group, base, scale, dim);
            continue;
          }
#endif
          tile_kernels[dim / 32 - 1](out, q, packed[task.packed], scratch, task.first_row, task.rows, heads, h, group, base, scale);
          continue;
        }
      }
#endif
      const int64_t t = task.first_row;
      const int64_t length = before + (t - query_start[s]) + 1;  // positions this row sees
      T* out_rows = out + (t * heads + h * group) * dim;
      if (length <= 0) {  // nothing to attend to: a zero row, never a read before the context
        std::fill(out_rows, out_rows + group * dim, static_cast<T>(0));
        continue;
      }
      if (offsets_for != s) {
        row_offsets(offsets, block_tables + s * max_blocks, seq_lens[s], block_size, dim);
        offsets_for = s;
      }
      if (task.parts > 1) {
        const int64_t from = length * task.part / task.parts, count = length * (task.part + 1) / task.parts - from;
        const PagedRows<T> keys{k_cache + h * slots * dim, offsets.data() + from};
        const PagedRows<T> values{v_cache + h * slots * dim, offsets.data() + from};
        Partial& partial = partials[task.split][task.part];
        partial.max.resize(group);
        partial.sum.resize(group);
        partial.acc.resize(group * dim);
        scores.resize(group * count);
        score<T>(scores.data(), q + (t * heads + h * group) * dim, keys, group, count, dim, scale);
        for (int64_t g = 0; g < group; ++g) partial.sum[g] = exp_shifted(scores.data() + g * count, count, &partial.max[g]);
        weigh<T>(partial.acc.data(), scores.data(), values, group, count, dim);
        continue;
      }
      const PagedRows<T> keys{k_cache + h * slots * dim, offsets.data()};
      const PagedRows<T> values{v_cache + h * slots * dim, offsets.data()};
      scores.resize(group * length);
      score<T>(scores.data(), q + (t * heads + h * group) * dim, keys, group, length, dim, scale);
      // the softmax's division, applied to p.v rather than to each probability
      for (int64_t g = 0; g < group; ++g) inverse_sum[g] = 1.f / exp_shifted(scores.data() + g * length, length);
      weigh<T>(acc.data(), scores.data(), values, group, length, dim);
      for (int64_t i = 0; i < group * dim; ++i) out_rows[i] = static_cast<T>(acc[i] * inverse_sum[i / dim]);
    }
    // each split row: its parts' sums rescaled to the largest max, then divided
#pragma omp for schedule(static)
    for (int64_t split = 0; split < split_rows; ++split) {
      const Task& task = split_first[split];
      const std::vector<Partial>& parts = partials[split];
      T* out_rows = out + (task.first_row * heads + task.head * group) * dim;
      for (int64_t g = 0; g < group; ++g) {
        float top = parts[0].max[g];
        for (const Partial& part : parts) top = std::max(top, part.max[g]);
        std::fill(acc.begin(), acc.begin() + dim, 0.f);
        float total = 0.f;
        for (const Partial& part : parts) {
          const float weight = exp_nonpositive(part.max[g] - top);
          total += weight * part.sum[g];
          for (int64_t d = 0; d < dim; ++d) acc[d] += weight * part.acc[g * dim + d];
        }
        for (int64_t d = 0; d < dim; ++d) out_rows[g * dim + d] = static_cast<T>(acc[d] / total);
      }
    }
  }
}

template <typename T>
void run(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
         const at::Tensor& block_tables, const at::Tensor& query_start, const at::Tensor& seq_lens,
         int64_t block_size, double scale, bool amx) {
  attend<T>(out.data_ptr<T>(), q.data_ptr<T>(), k_cache.data_ptr<T>(), v_cache.data_ptr<T>(),
            block_tables.data_ptr<int32_t>(), query_start.data_ptr<int32_t>(), seq_lens.data_ptr<int32_t>(),
            seq_lens.size(0), q.size(1), k_cache.size(0), k_cache.size(1), block_tables.size(1), block_size,
            static_cast<float>(scale), q.size(2), amx && amx_ready());
}

}  // namespace

// amx=false keeps prefill tiles on AVX512-BF16 where AMX could run (the tests check both on one machine)
at::Tensor paged_attention(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache, at::Tensor block_tables,
                           at::Tensor query_start, at::Tensor seq_lens, int64_t block_size, double scale, bool amx) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 3 && v_cache.dim() == 3, "q [tokens, heads, D], caches [kv_heads, slots, D]");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(), "q and the caches must be contiguous");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && k_cache.scalar_type() == v_cache.scalar_type(), "one dtype");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), "K and V caches of one shape");
  TORCH_CHECK(q.size(2) == k_cache.size(2) && q.size(1) % k_cache.size(0) == 0, "head_dim and GQA ratio");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && query_start.scalar_type() == at::kInt &&
                  seq_lens.scalar_type() == at::kInt, "int32 tables, query starts and lengths");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.is_contiguous() && query_start.is_contiguous() && seq_lens.is_contiguous(),
              "contiguous tables");
  TORCH_CHECK(block_tables.size(0) == seq_lens.size(0) && query_start.size(0) == seq_lens.size(0) + 1,
              "one table row and length per sequence, one more query start");
  TORCH_CHECK(block_size > 0, "block_size must be positive");
  const int32_t* starts = query_start.data_ptr<int32_t>();
  const int32_t* lengths = seq_lens.data_ptr<int32_t>();
  TORCH_CHECK(starts[0] == 0 && starts[seq_lens.size(0)] == q.size(0), "query_start must run from 0 to q's row count");
  for (int64_t s = 0; s < seq_lens.size(0); ++s) {
    TORCH_CHECK(starts[s] <= starts[s + 1], "query_start must not decrease");
    TORCH_CHECK(lengths[s] >= 0 && lengths[s] <= block_tables.size(1) * block_size, "every context must fit its block table");
  }
  auto out = at::empty_like(q);
  switch (q.scalar_type()) {
    case at::kFloat: run<float>(out, q, k_cache, v_cache, block_tables, query_start, seq_lens, block_size, scale, amx); break;
    case at::kBFloat16:
      run<c10::BFloat16>(out, q, k_cache, v_cache, block_tables, query_start, seq_lens, block_size, scale, amx);
      break;
    case at::kHalf: run<c10::Half>(out, q, k_cache, v_cache, block_tables, query_start, seq_lens, block_size, scale, amx); break;
    default: TORCH_CHECK(false, "unsupported dtype ", q.scalar_type());
  }
  return out;
}
