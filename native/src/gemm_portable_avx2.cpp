// The small GEMM's portable and AVX2 kernels (see small_gemm.cpp for how a call chooses one).
//  * AVX2: 4 weight rows x 3 activation rows, 8 lanes (8 x 1 for one row).
//  * portable: plain loops in the AVX2 kernel's summation order (the two agree bit for bit).
#include <cmath>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "gemm_avx2_simd.hpp"
#include "gemm_kernels.hpp"

namespace dart {
namespace gemm {
namespace {

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
void rows_portable_t(const float* x, const W* w, float* y, int64_t M, int64_t N, int64_t K, int64_t n0,
                   int64_t n1) {
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m) y[m * N + n] = dot_portable(x + m * K, w + n * K, K);
}

#ifdef DART_X86

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

// As rows_avx512_many, with the AVX2 kernel's 4 x 3 blocks: the thread's bf16 weight rows widened to float32 once
// per call, about 96 KiB at a time, for every group of 3 x rows (the loop below widens a block again per group).
// The same FMAs in the same order as block<R, C, uint16_t>: the same bits.
template <typename W>
__attribute__((target("avx2,fma"))) void rows_avx2_many(const float* x, const W* w, float* y, int64_t M, int64_t N,
                                                        int64_t K, int64_t n0, int64_t n1) {
  constexpr bool bf16_weights = std::is_same<W, uint16_t>::value;
  const int64_t n4 = n0 + (n1 - n0) / 4 * 4;
  const int64_t step = many_rows_pass(K);
  thread_local std::vector<float> wide_buf;
  if constexpr (bf16_weights) wide_buf.resize(static_cast<size_t>(std::min(step, n4 - n0) * K + 8));
  for (int64_t a = n0; a < n4; a += step) {
    const int64_t b = std::min(n4, a + step);
    const float* wf;
    if constexpr (bf16_weights) {
      const int64_t total = (b - a) * K, body = total - total % 8;
      const uint16_t* wr = w + a * K;
      float* wide = wide_buf.data();
      for (int64_t i = 0; i < body; i += 8) _mm256_storeu_ps(wide + i, load8(wr + i));
      for (int64_t i = body; i < total; ++i) wide[i] = bf16_to_f32(wr[i]);
      wf = wide;
    } else {
      wf = w + a * K;
    }
    for (int64_t m = 0; m < M; m += 3) {
      const int64_t c = std::min<int64_t>(3, M - m);
      for (int64_t n = a; n < b; n += 4) {
        const float* wb = wf + (n - a) * K;
        if (c == 3) block<4, 3>(x, wb, y + n, N, K, 0, m);
        else if (c == 2) block<4, 2>(x, wb, y + n, N, K, 0, m);
        else block<4, 1>(x, wb, y + n, N, K, 0, m);
      }
    }
  }
  for (int64_t n = n4; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m) block<1, 1>(x, w, y, N, K, n, m);
}

template <typename W>
__attribute__((target("avx2,fma"))) void rows_avx2_t(const float* x, const W* w, float* y, int64_t M, int64_t N,
                                                   int64_t K, int64_t n0, int64_t n1, bool gemv_prefetch) {
  int64_t n = n0;
  if (M == 1) {  // plain decoding step: stream 8 rows at a time
    const int64_t block_lines = static_cast<int64_t>(8 * K * sizeof(W) + 63) / 64;
    for (; n + 8 <= n1; n += 8) {
      const bool next = gemv_prefetch && n + 16 <= n1;
      block<8, 1>(x, w, y, N, K, n, 0, next ? reinterpret_cast<const char*>(w + (n + 8) * K) : nullptr,
                  next ? block_lines : 0);
    }
  } else if (M >= many_rows.load(std::memory_order_relaxed)) {
    return rows_avx2_many(x, w, y, M, N, K, n0, n1);
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

}  // namespace

void rows_portable(const float* x, const float* w, float* y, int64_t M, int64_t N, int64_t K, int64_t n0, int64_t n1) {
  rows_portable_t(x, w, y, M, N, K, n0, n1);
}
void rows_portable(const float* x, const uint16_t* w, float* y, int64_t M, int64_t N, int64_t K, int64_t n0,
                   int64_t n1) {
  rows_portable_t(x, w, y, M, N, K, n0, n1);
}
#ifdef DART_X86
void rows_avx2(const float* x, const float* w, float* y, int64_t M, int64_t N, int64_t K, int64_t n0, int64_t n1,
               bool gemv_prefetch) {
  rows_avx2_t(x, w, y, M, N, K, n0, n1, gemv_prefetch);
}
void rows_avx2(const float* x, const uint16_t* w, float* y, int64_t M, int64_t N, int64_t K, int64_t n0, int64_t n1,
               bool gemv_prefetch) {
  rows_avx2_t(x, w, y, M, N, K, n0, n1, gemv_prefetch);
}
#endif

}  // namespace gemm
}  // namespace dart
