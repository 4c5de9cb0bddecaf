// AVX2 helpers of the small GEMM shared by gemm_portable_avx2.cpp and gemm_avx512.cpp (whose smallest-M kernel runs
// 256-bit operations): 8-lane loads (bf16 widened by a shift) and the horizontal sum in the portable path's order.
#pragma once

#include <cstdint>

#include "gemm_kernels.hpp"

#ifdef DART_X86
namespace dart {
namespace gemm {
namespace {

__attribute__((target("avx2,fma"))) inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
__attribute__((target("avx2,fma"))) inline __m256 load8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
// Same order as dot_portable: fold the upper 4 lanes onto the lower, then (0+2)+(1+3).
__attribute__((target("avx2,fma"))) inline float hsum(__m256 v) {
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 a = _mm_add_ps(q, _mm_movehl_ps(q, q));       // (q0+q2, q1+q3, ...)
  const __m128 b = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));   // (q0+q2)+(q1+q3)
  return _mm_cvtss_f32(b);
}

}  // namespace
}  // namespace gemm
}  // namespace dart
#endif
