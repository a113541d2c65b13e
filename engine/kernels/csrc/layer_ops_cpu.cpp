// The elementwise steps of a decoder layer, each one pass over its rows instead of the 3-10
// torch ops that engine/model/layer_ops.py's torch versions run: at batch 1 those ops' dispatch
// cost more than their arithmetic (SmolLM2: ~900 ops a decode step).
// Each computes in float32 and rounds once, to the weights' dtype, where the torch versions
// round after every op (2-3 times): in bf16, SmolLM2 teacher-forced against fp32 transformers
// agrees at 0.987 top-1 this way, at 0.981 rounding as torch does.
// Built with engine/kernels/csrc/paged_attention_cpu.cpp into one module (engine/kernels/cpu_build.py).
#include "aten_parts.h"

#include "cpu_math.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

using k25::exp_nonpositive;
using k25::to_float;

template <typename T>
inline T from_float(float x) { return static_cast<T>(x); }  // round to nearest even, as torch's casts

// rows per task: enough work per thread that a step of a few rows runs on one
constexpr int64_t kGrainElements = 1 << 14;

inline int64_t grain_rows(int64_t row_elements) { return std::max<int64_t>(1, kGrainElements / std::max<int64_t>(1, row_elements)); }

template <typename T>
void add_rms_norm_rows(float* x, const T* delta, const T* weight, T* out, int64_t rows, int64_t hidden, float eps) {
  at::parallel_for(0, rows, grain_rows(hidden), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* row = x + r * hidden;
      if (delta != nullptr) {
        const T* d = delta + r * hidden;
        for (int64_t i = 0; i < hidden; ++i) row[i] += to_float(d[i]);
      }
      float sum = 0.f;
      for (int64_t i = 0; i < hidden; ++i) sum += row[i] * row[i];
      const float inverse_rms = 1.f / std::sqrt(sum / static_cast<float>(hidden) + eps);
      T* o = out + r * hidden;
      for (int64_t i = 0; i < hidden; ++i) o[i] = from_float<T>(to_float(weight[i]) * (row[i] * inverse_rms));
    }
  });
}

// qkv [tokens, (heads + 2 kv_heads) * D]: q and k rotated (HF's half rotation: pairs i, i + D/2),
// q into out [tokens, heads, D], k and v into the caches [kv_heads, slots, D] at each token's slot
template <typename T>
void rotary_to_cache_rows(const T* qkv, const T* cos, const T* sin, const int64_t* positions, const int64_t* slots,
                          T* q_out, T* k_cache, T* v_cache, int64_t tokens, int64_t heads, int64_t kv_heads,
                          int64_t head_dim, int64_t cache_slots) {
  const int64_t half = head_dim / 2, width = (heads + 2 * kv_heads) * head_dim;
  at::parallel_for(0, tokens, grain_rows(width), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const T* c = cos + positions[t] * half;
      const T* s = sin + positions[t] * half;
      const T* row = qkv + t * width;
      for (int64_t h = 0; h < heads + kv_heads; ++h) {
        const T* in = row + h * head_dim;
        T* o = h < heads ? q_out + (t * heads + h) * head_dim
                         : k_cache + ((h - heads) * cache_slots + slots[t]) * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          const float first = to_float(in[i]), second = to_float(in[i + half]);
          const float cos_i = to_float(c[i]), sin_i = to_float(s[i]);
          o[i] = from_float<T>(first * cos_i - second * sin_i);
          o[i + half] = from_float<T>(second * cos_i + first * sin_i);
        }
      }
      const T* v = row + (heads + kv_heads) * head_dim;
      for (int64_t h = 0; h < kv_heads; ++h)
        std::memcpy(v_cache + (h * cache_slots + slots[t]) * head_dim, v + h * head_dim, head_dim * sizeof(T));
    }
  });
}

// gate_up [tokens, 2I] -> silu(gate) * up [tokens, I]
template <typename T>
void silu_mul_rows(const T* gate_up, T* out, int64_t tokens, int64_t inner) {
  at::parallel_for(0, tokens, grain_rows(2 * inner), [&](int64_t begin, int64_t end) {
    std::vector<float> row(inner);  // in float first: the loop over it vectorises, the rounding apart
    for (int64_t t = begin; t < end; ++t) {
      const T* gate = gate_up + t * 2 * inner;
      const T* up = gate + inner;
      float* r = row.data();
#pragma omp simd
      for (int64_t i = 0; i < inner; ++i) {
        const float g = to_float(gate[i]);
        // sigmoid from exp(-|g|): no overflow. Past |g| = 87 exp_nonpositive clamps (to a tiny
        // e that leaves 1 + e = 1) while the true exp(-|g|) is below float32's normals: so
        // silu is g above 87 and 0 below -87, as torch's. Selects only, no branch: it vectorises
        const float e = exp_nonpositive(-std::fabs(g));
        const float below = g < -87.f ? 0.f : 1.f;
        const float sigmoid = (g >= 0.f ? 1.f : e) / (1.f + e);
        r[i] = below * g * sigmoid * to_float(up[i]);
      }
      T* o = out + t * inner;
      for (int64_t i = 0; i < inner; ++i) o[i] = from_float<T>(r[i]);
    }
  });
}

#define K25_DISPATCH(dtype, ...)                                                  \
  switch (dtype) {                                                                \
    case at::kFloat: { using T = float; __VA_ARGS__; break; }                     \
    case at::kBFloat16: { using T = c10::BFloat16; __VA_ARGS__; break; }          \
    case at::kHalf: { using T = c10::Half; __VA_ARGS__; break; }                  \
    default: TORCH_CHECK(false, "unsupported dtype ", dtype);                     \
  }

}  // namespace

at::Tensor add_rms_norm(at::Tensor x, c10::optional<at::Tensor> delta, at::Tensor weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x: a contiguous float32 [tokens, hidden]");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1) && weight.is_contiguous(), "weight: [hidden]");
  if (delta.has_value()) {
    TORCH_CHECK(delta->sizes() == x.sizes() && delta->is_contiguous() && delta->scalar_type() == weight.scalar_type(),
                "delta: contiguous, x's shape, the weight's dtype");
  }
  auto out = at::empty(x.sizes(), weight.options());
  K25_DISPATCH(weight.scalar_type(),
               add_rms_norm_rows<T>(x.data_ptr<float>(), delta.has_value() ? delta->data_ptr<T>() : nullptr,
                                    weight.data_ptr<T>(), out.data_ptr<T>(), x.size(0), x.size(1), static_cast<float>(eps)));
  return out;
}

at::Tensor rotary_to_cache(at::Tensor qkv, at::Tensor cos, at::Tensor sin, at::Tensor positions,
                           at::Tensor slot_mapping, at::Tensor k_cache, at::Tensor v_cache, int64_t heads) {
  TORCH_CHECK(k_cache.dim() == 3 && k_cache.sizes() == v_cache.sizes() && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "caches: contiguous [kv_heads, slots, head_dim], one shape");
  const int64_t kv_heads = k_cache.size(0), cache_slots = k_cache.size(1), head_dim = k_cache.size(2);
  TORCH_CHECK(head_dim % 2 == 0 && heads > 0 && heads % kv_heads == 0, "an even head_dim, heads a multiple of kv_heads");
  TORCH_CHECK(qkv.dim() == 2 && qkv.is_contiguous() && qkv.size(1) == (heads + 2 * kv_heads) * head_dim,
              "qkv: contiguous [tokens, (heads + 2 kv_heads) * head_dim]");
  TORCH_CHECK(cos.dim() == 2 && cos.sizes() == sin.sizes() && cos.size(1) == head_dim / 2 && cos.is_contiguous() && sin.is_contiguous(),
              "cos, sin: contiguous [positions, head_dim / 2]");
  for (const auto& t : {cos, sin, k_cache, v_cache})
    TORCH_CHECK(t.scalar_type() == qkv.scalar_type(), "one dtype for qkv, the tables and the caches");
  const int64_t tokens = qkv.size(0);
  TORCH_CHECK(positions.scalar_type() == at::kLong && slot_mapping.scalar_type() == at::kLong &&
                  positions.numel() == tokens && slot_mapping.numel() == tokens && positions.is_contiguous() &&
                  slot_mapping.is_contiguous(),
              "positions, slot_mapping: contiguous int64, one per token");
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK(pos[t] >= 0 && pos[t] < cos.size(0), "position ", pos[t], " outside the rotary tables");
    TORCH_CHECK(slots[t] >= 0 && slots[t] < cache_slots, "slot ", slots[t], " outside the cache");
  }
  auto q = at::empty({tokens, heads, head_dim}, qkv.options());
  K25_DISPATCH(qkv.scalar_type(),
               rotary_to_cache_rows<T>(qkv.data_ptr<T>(), cos.data_ptr<T>(), sin.data_ptr<T>(), pos, slots, q.data_ptr<T>(),
                                       k_cache.data_ptr<T>(), v_cache.data_ptr<T>(), tokens, heads, kv_heads, head_dim,
                                       cache_slots));
  return q;
}

at::Tensor silu_mul(at::Tensor gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.is_contiguous() && gate_up.size(1) % 2 == 0, "gate_up: contiguous [tokens, 2 * inner]");
  const int64_t inner = gate_up.size(1) / 2;
  auto out = at::empty({gate_up.size(0), inner}, gate_up.options());
  K25_DISPATCH(gate_up.scalar_type(), silu_mul_rows<T>(gate_up.data_ptr<T>(), out.data_ptr<T>(), gate_up.size(0), inner));
  return out;
}
