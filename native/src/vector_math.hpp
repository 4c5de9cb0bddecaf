// Vector math shared by the native decoder's files (decoder.cpp, attention.cpp): which helpers the GEMM path lets
// run, and exp on 8 / 16 lanes.
#pragma once

#include <cstdint>

#include "small_gemm.hpp"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define DART_X86 1
#endif

namespace dart {
namespace {

// The AVX2 helpers below (exp, softmax, SiLU, weighted sums) run on the avx2 and avx512 GEMM paths; forcing
// the portable path (DART_GEMM_PATH=portable, tests) runs the plain loops, as on a non-x86 CPU.
inline bool avx2_helpers() { return small_gemm_path() != GemmPath::Portable; }
// The paths that run AVX-512 (avx512, avx512bf16, amx) also run attention's weighted sums on zmm registers: the same
// FMAs per column in the same order as the AVX2 helpers (the same bits), on whole value rows at a time.
inline bool avx512_helpers() { return static_cast<int>(small_gemm_path()) >= static_cast<int>(GemmPath::Avx512); }

#ifdef DART_X86
// exp(x) for 8 lanes, Cephes' single-precision polynomial (about 1 ulp over the softmax range;
// inputs below -87.3 give ~1e-38, not 0: callers zero masked lanes themselves).
__attribute__((target("avx2,fma"))) inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3365478515625f)), _mm256_set1_ps(88.3762626647949f));
  __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(0.693359375f)));
  x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(-2.12194440e-4f)));
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i pow2 = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(pow2));
}

// exp8's steps on 16 lanes (the same operations per lane, so the same bits).
__attribute__((target("avx512f,avx2,fma"))) inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3365478515625f)), _mm512_set1_ps(88.3762626647949f));
  __m512 fx = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                   _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  x = _mm512_sub_ps(x, _mm512_mul_ps(fx, _mm512_set1_ps(0.693359375f)));
  x = _mm512_sub_ps(x, _mm512_mul_ps(fx, _mm512_set1_ps(-2.12194440e-4f)));
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
  const __m512i pow2 = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(pow2));
}
#endif

}  // namespace
}  // namespace dart
