// See small_gemm.hpp. Layout of the AVX2 kernel: a block of R weight rows is converted
// to float32 8 lanes at a time and multiplied into C activation rows (R x C
// accumulators), so each weight element is loaded from memory once per call. The
// lane-wise partial sums are reduced in one fixed order at the end of every dot
// product, which makes the result independent of M and of the row blocking.
#include "small_gemm.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define DART_X86 1
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

namespace dart {
namespace {


inline float bf16_to_f32(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline float load_scalar(const float* p) { return *p; }
inline float load_scalar(const uint16_t* p) { return bf16_to_f32(*p); }

// Portable path with the same summation order as the AVX2 path: 8 lane sums over the
// body, reduced pairwise as the AVX2 horizontal sum does, then the tail added in order.
template <typename W>
float dot_portable(const float* x, const W* w, int64_t K) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t body = K - K % 8;
  for (int64_t k = 0; k < body; k += 8)
    for (int l = 0; l < 8; ++l) lanes[l] = std::fma(x[k + l], load_scalar(w + k + l), lanes[l]);
  float q[4];
  for (int l = 0; l < 4; ++l) q[l] = lanes[l] + lanes[l + 4];
  float s = (q[0] + q[2]) + (q[1] + q[3]);
  for (int64_t k = body; k < K; ++k) s = std::fma(x[k], load_scalar(w + k), s);
  return s;
}

template <typename W>
void rows_portable(const float* x, const W* w, float* y, int64_t M, int64_t N, int64_t K, int64_t n0,
                   int64_t n1) {
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m) y[m * N + n] = dot_portable(x + m * K, w + n * K, K);
}

#ifdef DART_X86
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

// R weight rows x C activation rows; R * C + R + 1 <= 16 ymm registers.
// prefetch/prefetch_lines: the next block's weights, fetched a few lines per k step. A block
// reads R rows side by side, R short streams the hardware prefetcher does not pick up.
template <int R, int C, typename W>
__attribute__((target("avx2,fma"))) void block(const float* x, const W* w, float* y, int64_t N, int64_t K,
                                               int64_t n, int64_t m, const char* prefetch = nullptr,
                                               int64_t prefetch_lines = 0) {
  __m256 acc[R][C];
  // The accumulators must live in registers: every constant-trip loop below is unrolled (GCC at -O2
  // would otherwise keep acc[][] on the stack, a load and a store per FMA).
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  const int64_t body = K - K % 8;
  const int64_t lines_per_step = prefetch ? (prefetch_lines * 8 + body - 1) / std::max<int64_t>(body, 8) : 0;
  int64_t line = 0;
  for (int64_t k = 0; k < body; k += 8) {
    for (int64_t p = 0; p < lines_per_step && line < prefetch_lines; ++p, ++line)
      _mm_prefetch(prefetch + line * 64, _MM_HINT_T0);
    __m256 xv[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) xv[c] = _mm256_loadu_ps(x + (m + c) * K + k);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 wv = load8(w + (n + r) * K + k);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(xv[c], wv, acc[r][c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      float s = hsum(acc[r][c]);
      const float* xr = x + (m + c) * K;
      const W* wr = w + (n + r) * K;
      for (int64_t k = body; k < K; ++k) s = std::fma(xr[k], load_scalar(wr + k), s);
      y[(m + c) * N + n + r] = s;
    }
}

template <typename W>
__attribute__((target("avx2,fma"))) void rows_avx2(const float* x, const W* w, float* y, int64_t M, int64_t N,
                                                   int64_t K, int64_t n0, int64_t n1) {
  int64_t n = n0;
  if (M == 1) {  // plain decoding step: stream 8 rows at a time
    const int64_t block_lines = static_cast<int64_t>(8 * K * sizeof(W) + 63) / 64;
    for (; n + 8 <= n1; n += 8) {
      const bool next = n + 16 <= n1;
      block<8, 1>(x, w, y, N, K, n, 0, next ? reinterpret_cast<const char*>(w + (n + 8) * K) : nullptr,
                  next ? block_lines : 0);
    }
  } else {  // M >= 2 (run() returns early for M = 0)
    // Each 4-row weight block stays in L1 while every group of 3 x rows passes (widening bf16
    // again per group costs less than a float32 copy of the block: measured).
    const int64_t block_lines = static_cast<int64_t>(4 * K * sizeof(W) + 63) / 64;
    for (; n + 4 <= n1; n += 4) {
      // The first group of x rows also prefetches the next weight block.
      const char* next = n + 8 <= n1 ? reinterpret_cast<const char*>(w + (n + 4) * K) : nullptr;
      const int64_t lines = next ? block_lines : 0;
      int64_t m = 0;
      if (M >= 3) {
        block<4, 3>(x, w, y, N, K, n, 0, next, lines);
        m = 3;
      } else {
        block<4, 2>(x, w, y, N, K, n, 0, next, lines);
        m = 2;
      }
      for (; m + 3 <= M; m += 3) block<4, 3>(x, w, y, N, K, n, m);
      if (M - m == 2) block<4, 2>(x, w, y, N, K, n, m);
      if (M - m == 1) block<4, 1>(x, w, y, N, K, n, m);
    }
  }
  for (; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m) block<1, 1>(x, w, y, N, K, n, m);
}
#endif

template <typename W>
void run(const float* x, const W* w, float* y, int64_t M, int64_t N, int64_t K, int threads) {
  // Split the weight rows into equal contiguous ranges (multiples of 8): each thread reads
  // its own part of the matrix once.
  // An empty product writes nothing; the multi-row kernel below starts with 2 rows, so M = 0
  // must never reach it (it once wrote two rows past a 0-row y).
  if (M <= 0 || N <= 0) return;
  const int64_t per = ((N + threads - 1) / threads + 7) / 8 * 8;
  const bool avx2 = small_gemm_has_avx2();
  auto part = [&](int t) {
    const int64_t n0 = std::min<int64_t>(N, t * per), n1 = std::min<int64_t>(N, n0 + per);
    if (n0 >= n1) return;
#ifdef DART_X86
    if (avx2) return rows_avx2(x, w, y, M, N, K, n0, n1);
#endif
    rows_portable(x, w, y, M, N, K, n0, n1);
  };
  (void)avx2;
#ifdef _OPENMP
  if (threads > 1 && N >= 64) {
#pragma omp parallel for num_threads(threads) schedule(static, 1)
    for (int t = 0; t < threads; ++t) part(t);
    return;
  }
#endif
  for (int t = 0; t < threads; ++t) part(t);
}

}  // namespace

bool small_gemm_has_avx2() {
#ifdef DART_X86
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
#else
  return false;
#endif
}

void small_gemm_f32(const float* x, const float* w, float* y, int64_t M, int64_t N, int64_t K, int threads) {
  run(x, w, y, M, N, K, std::max(1, threads));
}
void small_gemm_bf16(const float* x, const uint16_t* w, float* y, int64_t M, int64_t N, int64_t K, int threads) {
  run(x, w, y, M, N, K, std::max(1, threads));
}

}  // namespace dart
