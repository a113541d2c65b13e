// Paged attention on a CPU for a whole step (prefill slices and decodes): each query row reads
// its context's K/V rows in place through its block table (no gather into a scratch buffer),
// scores, softmax and the weighted sum of V in fp32, one task per (query row, KV head) with
// that head's query heads together, so every K/V row is read once for the whole GQA group.
// With AVX512-BF16 (bf16 caches) q.k runs as bf16 pair products summed in fp32 and V rows are
// widened once per 16 columns; other dtypes and CPUs take plain loops the compiler vectorises.
// Built by engine/cpu_kernels.py for the machine it runs on (-march=native).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "cpu_math.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace {

using k25::exp_nonpositive;
using k25::to_float;

// A sequence's context rows in one KV head of the cache: row(pos) is position pos's K (or V)
// row, found through the block table once per task rather than once per read.
template <typename T>
struct PagedRows {
  const T* head;  // this KV head's rows in the cache
  const int64_t* offsets;  // element offset of each position's row within a head
  const T* row(int64_t pos) const { return head + offsets[pos]; }
};

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

template <typename T>
void score(float* scores, const T* q, const PagedRows<T>& keys, int64_t group, int64_t length, int64_t dim, float scale) {
  score_rowwise(scores, q, keys, group, length, dim, scale);
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

// bf16 with head_dim a multiple of 32: products of bf16 pairs summed in fp32 (AVX512-BF16),
// 16 positions' dot products reduced together.
template <>
void score<c10::BFloat16>(float* scores, const c10::BFloat16* q, const PagedRows<c10::BFloat16>& keys, int64_t group,
                          int64_t length, int64_t dim, float scale) {
  if (dim % 32 != 0 || dim > 256 || group > 8) {
    score_rowwise(scores, q, keys, group, length, dim, scale);
    return;
  }
  const int64_t words = dim / 32;
  const __m512 scaled = _mm512_set1_ps(scale);
  __m512bh query[8 * 8];
  for (int64_t i = 0; i < group * words; ++i) query[i] = (__m512bh)_mm512_loadu_si512(q + i * 32);
  for (int64_t first = 0; first < length; first += 16) {
    const int64_t count = std::min<int64_t>(16, length - first);
    const __mmask16 valid = static_cast<__mmask16>((1u << count) - 1);
    for (int64_t g = 0; g < group; ++g) {  // the chunk's 16 K rows stay in L1 across the group
      __m512 dots[16];
      for (int64_t i = 0; i < 16; ++i) {
        dots[i] = _mm512_setzero_ps();
        if (i < count) {
          const c10::BFloat16* key = keys.row(first + i);
          for (int64_t w = 0; w < words; ++w)
            dots[i] = _mm512_dpbf16_ps(dots[i], query[g * words + w], (__m512bh)_mm512_loadu_si512(key + w * 32));
        }
      }
      _mm512_mask_storeu_ps(scores + g * length + first, valid, _mm512_mul_ps(sum_each(dots), scaled));
    }
  }
}
#endif

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

template <typename T>
void weigh(float* acc, const float* probs, const PagedRows<T>& values, int64_t group, int64_t length, int64_t dim) {
  weigh_rowwise(acc, probs, values, group, length, dim);
}

#if defined(__AVX512BF16__)
// One 16-wide column of the output for G query heads: accumulators in registers, each V row
// converted once, even and odd positions in separate accumulators (two FMA chains per head).
template <int G>
void weigh_column(float* acc, const float* probs, const PagedRows<c10::BFloat16>& values, int64_t length, int64_t dim,
                  int64_t column) {
  __m512 even[G], odd[G];
  for (int g = 0; g < G; ++g) even[g] = odd[g] = _mm512_setzero_ps();
  auto load = [&](int64_t pos) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values.row(pos) + column));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
  };
  int64_t pos = 0;
  for (; pos + 1 < length; pos += 2) {
    const __m512 first = load(pos), second = load(pos + 1);
    for (int g = 0; g < G; ++g) {
      even[g] = _mm512_fmadd_ps(_mm512_set1_ps(probs[g * length + pos]), first, even[g]);
      odd[g] = _mm512_fmadd_ps(_mm512_set1_ps(probs[g * length + pos + 1]), second, odd[g]);
    }
  }
  if (pos < length) {
    const __m512 last = load(pos);
    for (int g = 0; g < G; ++g) even[g] = _mm512_fmadd_ps(_mm512_set1_ps(probs[g * length + pos]), last, even[g]);
  }
  for (int g = 0; g < G; ++g) _mm512_storeu_ps(acc + g * dim + column, _mm512_add_ps(even[g], odd[g]));
}

// bf16 V with head_dim a multiple of 16 and up to 8 query heads per KV head
template <>
void weigh<c10::BFloat16>(float* acc, const float* probs, const PagedRows<c10::BFloat16>& values, int64_t group,
                          int64_t length, int64_t dim) {
  using Column = void (*)(float*, const float*, const PagedRows<c10::BFloat16>&, int64_t, int64_t, int64_t);
  static constexpr Column by_group[] = {nullptr, weigh_column<1>, weigh_column<2>, weigh_column<3>, weigh_column<4>,
                                        weigh_column<5>, weigh_column<6>, weigh_column<7>, weigh_column<8>};
  if (dim % 16 != 0 || group > 8) return weigh_rowwise(acc, probs, values, group, length, dim);
  for (int64_t column = 0; column < dim; column += 16) by_group[group](acc, probs, values, length, dim, column);
}
#endif

// Every query row of the batch: row i of sequence s (n_s rows this step, L_s tokens in context
// after it) sits at position L_s - n_s + i and attends to positions 0 .. that one (causal
// within the step's own rows; a decode is the case n_s = 1). One task per (row, KV head).
template <typename T>
void attend(T* out, const T* q, const T* k_cache, const T* v_cache, const int32_t* block_tables,
            const int32_t* query_start, const int32_t* seq_lens, int64_t num_seqs, int64_t tokens, int64_t heads,
            int64_t kv_heads, int64_t slots, int64_t max_blocks, int64_t block_size, float scale, int64_t dim) {
  const int64_t group = heads / kv_heads;
  std::vector<int32_t> seq_of(tokens);  // the sequence each query row belongs to
  for (int64_t s = 0; s < num_seqs; ++s)
    for (int64_t t = query_start[s]; t < query_start[s + 1]; ++t) seq_of[t] = static_cast<int32_t>(s);
  // a decode row reads its whole context from memory; a prefill row mostly what its neighbours
  // just brought into the cache: small grains for the first, larger for the second
  const int64_t grain = tokens > num_seqs ? 4 : 1;
  at::parallel_for(0, tokens * kv_heads, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, acc(group * dim);
    std::vector<int64_t> offsets;
    int64_t offsets_for = -1;  // the sequence `offsets` holds rows of
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / kv_heads, h = task % kv_heads, s = seq_of[t];
      const int64_t length = seq_lens[s] - (query_start[s + 1] - 1 - t);  // positions this row sees
      T* out_rows = out + (t * heads + h * group) * dim;
      if (length <= 0) {  // nothing to attend to: a zero row, never a read before the context
        std::fill(out_rows, out_rows + group * dim, static_cast<T>(0));
        continue;
      }
      if (offsets_for != s) {
        row_offsets(offsets, block_tables + s * max_blocks, seq_lens[s], block_size, dim);
        offsets_for = s;
      }
      const PagedRows<T> keys{k_cache + h * slots * dim, offsets.data()};
      const PagedRows<T> values{v_cache + h * slots * dim, offsets.data()};
      scores.resize(group * length);
      score<T>(scores.data(), q + (t * heads + h * group) * dim, keys, group, length, dim, scale);
      for (int64_t g = 0; g < group; ++g) {
        float* sg = scores.data() + g * length;
        float m = sg[0];
        for (int64_t pos = 1; pos < length; ++pos) m = std::max(m, sg[pos]);
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t pos = 0; pos < length; ++pos) {
          sg[pos] = exp_nonpositive(sg[pos] - m);
          sum += sg[pos];
        }
        const float inv = 1.f / sum;
        for (int64_t pos = 0; pos < length; ++pos) sg[pos] *= inv;
      }
      weigh<T>(acc.data(), scores.data(), values, group, length, dim);
      for (int64_t i = 0; i < group * dim; ++i) out_rows[i] = static_cast<T>(acc[i]);
    }
  });
}

template <typename T>
void run(torch::Tensor& out, const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
         const torch::Tensor& block_tables, const torch::Tensor& query_start, const torch::Tensor& seq_lens,
         int64_t block_size, double scale) {
  attend<T>(out.data_ptr<T>(), q.data_ptr<T>(), k_cache.data_ptr<T>(), v_cache.data_ptr<T>(),
            block_tables.data_ptr<int32_t>(), query_start.data_ptr<int32_t>(), seq_lens.data_ptr<int32_t>(),
            seq_lens.size(0), q.size(0), q.size(1), k_cache.size(0), k_cache.size(1), block_tables.size(1), block_size,
            static_cast<float>(scale), q.size(2));
}

}  // namespace

torch::Tensor paged_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor block_tables,
                              torch::Tensor query_start, torch::Tensor seq_lens, int64_t block_size, double scale) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 3 && v_cache.dim() == 3, "q [tokens, heads, D], caches [kv_heads, slots, D]");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(), "q and the caches must be contiguous");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && k_cache.scalar_type() == v_cache.scalar_type(), "one dtype");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), "K and V caches of one shape");
  TORCH_CHECK(q.size(2) == k_cache.size(2) && q.size(1) % k_cache.size(0) == 0, "head_dim and GQA ratio");
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt32 && query_start.scalar_type() == torch::kInt32 &&
                  seq_lens.scalar_type() == torch::kInt32, "int32 tables, query starts and lengths");
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
  auto out = torch::empty_like(q);
  switch (q.scalar_type()) {
    case torch::kFloat32: run<float>(out, q, k_cache, v_cache, block_tables, query_start, seq_lens, block_size, scale); break;
    case torch::kBFloat16:
      run<c10::BFloat16>(out, q, k_cache, v_cache, block_tables, query_start, seq_lens, block_size, scale);
      break;
    case torch::kFloat16: run<c10::Half>(out, q, k_cache, v_cache, block_tables, query_start, seq_lens, block_size, scale); break;
    default: TORCH_CHECK(false, "unsupported dtype ", q.scalar_type());
  }
  return out;
}
