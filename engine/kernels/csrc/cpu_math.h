// Helpers the CPU kernels share: widening a cache or weight element (or, with AVX2, 8 bf16
// ones; with AVX512, 16) to float, and a vectorisable exp.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace k25 {

#if defined(__AVX2__)
// 8 bfloat16 (the upper halves of float32) to float32
inline __m256 widen8(const void* bf16) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(static_cast<const __m128i*>(bf16))), 16));
}
#endif

#if defined(__AVX512F__)
// 16 bfloat16 (the upper halves of float32) to float32
inline __m512 widen16(const void* bf16) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(static_cast<const __m256i*>(bf16))), 16));
}
#endif

inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) {
  uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}
inline float to_float(c10::Half x) { return static_cast<float>(x); }

// exp for x <= 0 (scores minus their maximum), vectorisable: 2^n by the exponent bits times
// a degree-7 polynomial on the reduced argument (|r| <= ln2 / 2); relative error under
// float32's eps (0.83 eps over [-87, 0]). ln 2 is split in two (Cody and Waite) so that
// x - n ln 2 is exact; folded into one product, the error grows with |x| (30 eps at -80).
// The two steps are explicit fused multiply-adds: -fassociative-math (engine/kernels/cpu_build.py's
// flags) may fold two plain subtractions back into one, and GCC 12 did so in vectorised loops
// even behind __builtin_assoc_barrier (17 eps at -36).
inline float exp_nonpositive(float x) {
  x = x < -87.f ? -87.f : x;
  const float n = static_cast<float>(static_cast<int32_t>(x * 1.44269504f - 0.5f));
  const float r = std::fma(n, -1.428606765330187e-06f, std::fma(n, -0.693145751953125f, x));
  float p = 1.f / 5040;
  p = p * r + 1.f / 720;
  p = p * r + 1.f / 120;
  p = p * r + 1.f / 24;
  p = p * r + 1.f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

}  // namespace k25
