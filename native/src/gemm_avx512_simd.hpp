// AVX-512 helpers of the small GEMM shared by gemm_avx512.cpp and gemm_avx512bf16.cpp: 16-lane loads and the
// horizontal sums whose fixed order makes every output independent of M and of the blocking.
#pragma once

#include <cstdint>

#include "gemm_kernels.hpp"

#ifdef DART_X86
namespace dart {
namespace gemm {
namespace {

// ---- AVX-512 (F + BW + VL): 16 float lanes, 32 zmm registers --------------------------------------
// Summation order of one output (fixed by K alone): 16 lane sums over the 16-wide body, then the
// K % 16 tail as one more masked 16-lane step (zeros in the unused lanes), then the reduction of
// hsum16. Blocking never changes it, so a row does not depend on M or on the other rows.
#define DART_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))
DART_AVX512 inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
DART_AVX512 inline __m512 load16(const uint16_t* p) {   // bf16 -> f32: zero-extend, shift into the high half
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
// Masked loads read nothing outside the mask (no fault past the end of a row or of the matrix).
DART_AVX512 inline __m512 load16(const float* p, __mmask16 mask) { return _mm512_maskz_loadu_ps(mask, p); }
DART_AVX512 inline __m512 load16(const uint16_t* p, __mmask16 mask) {
  const __m256i h = _mm256_maskz_loadu_epi16(mask, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
// Fold 16 -> 8 -> 4 lanes (upper half onto lower), then (0+2)+(1+3).
DART_AVX512 inline float hsum16(__m512 v) {
  const __m256 upper = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  const __m256 o = _mm256_add_ps(_mm512_castps512_ps256(v), upper);
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(o), _mm256_extractf128_ps(o, 1));
  const __m128 a = _mm_add_ps(q, _mm_movehl_ps(q, q));
  const __m128 b = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));
  return _mm_cvtss_f32(b);
}

// [hsum16(a), hsum16(b), hsum16(c), hsum16(d)]: the same additions in the same order per vector as
// hsum16 (bit-identical), a third of the instructions. 128-bit chunks v = [v0 v1 v2 v3]:
// o = [v0+v2, v1+v3] (16 -> 8), q = o0+o1 (8 -> 4), then (q0+q2)+(q1+q3).
DART_AVX512 inline __m128 hsum16x4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));   // [oa0 oa1 ob0 ob1]
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 q = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));  // [qa qb qc qd]
  const __m512 p = _mm512_add_ps(q, _mm512_permute_ps(q, _MM_SHUFFLE(1, 0, 3, 2)));       // q0+q2, q1+q3
  const __m512 r = _mm512_add_ps(p, _mm512_permute_ps(p, _MM_SHUFFLE(2, 3, 0, 1)));       // lane 0: sum
  const __m512i lane0s = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(lane0s, r));
}

}  // namespace
}  // namespace gemm
}  // namespace dart
#endif
