// See small_gemm.hpp. The kernels, chosen per call by small_gemm_path():
//  * AVX-512: a block of 4 weight rows is widened to float32 16 lanes at a time (bf16: one
//    zero-extend + shift per 16 elements) and multiplied into groups of 6 activation rows
//    (24 zmm accumulators + 4 weight vectors + 1 activation vector of the 32 registers); the
//    4 outputs of an activation row are reduced together (hsum16x4). M <= 3 (a decoding step, the
//    smallest trees: memory-bound) runs 4 weight rows with 256-bit operations in the same 16-lane
//    order. x is copied into 64-byte aligned rows when it is not aligned (the values unchanged).
//  * AVX2: 4 weight rows x 3 activation rows, 8 lanes (8 x 1 for one row).
//  * portable: plain loops in the AVX2 kernel's summation order.
//  * AVX512-BF16 (bf16 weights): the activations rounded to bf16 once per call, VDPBF16PS against the weights as
//    loaded (no widening), weight rows one after the other for M <= 7, 4 x 6 blocks above; float32 weights run the
//    AVX-512 kernel.
//  * AMX (bf16 weights): the activations rounded as on AVX512-BF16 and laid out as tiles, TDPBF16PS against tiles of
//    16 weight rows loaded where they lie; up to 16 activation rows cost one tile product, so a tree's rows come
//    almost free. float32 weights run the AVX-512 kernel.
// The calls split the weight rows into chunks that a persistent thread pool claims in order (parallel_items).
// Each weight element is loaded from memory once per call. The lane-wise partial sums are
// reduced in one fixed order at the end of every dot product, which makes the result
// independent of M and of the row blocking (within one path).
#include "small_gemm.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <type_traits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#include <immintrin.h>
#define DART_X86 1
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#define DART_PTHREAD 1
#endif

namespace dart {
namespace {


// Benchmarks only (small_gemm_set_legacy): run the kernels as before the thread pool (an OpenMP region per call,
// equal contiguous ranges) and one row with 256-bit blocks on every CPU, for before/after arms in one process.
std::atomic<bool> legacy_mode{false};
// The row count from which the AVX-512 and AVX2 kernels widen a call's bf16 weights once for all rows
// (rows_avx512_many, rows_avx2_many); small_gemm_set_many_rows moves it (benchmarks).
std::atomic<int64_t> many_rows{12};
// Weight rows the many-rows kernels widen per pass: about 96 KiB of float32, a multiple of 4 (a thread's range may
// be every row of a single-threaded call).
int64_t many_rows_pass(int64_t K) { return std::max<int64_t>(4, (96 << 10) / std::max<int64_t>(1, K * 4) / 4 * 4); }

// Per path (indexed by GemmPath): whether the one-row kernel (the plain decoding step's GEMV) prefetches the next
// block of weight rows in software (small_gemm_set_gemv_prefetch). Only the speed depends on it, never a result.
std::atomic<bool> gemv_prefetch_on[5] = {true, true, true, true, true};

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
__attribute__((target("avx2,fma"))) void rows_avx2(const float* x, const W* w, float* y, int64_t M, int64_t N,
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

#ifdef DART_X86
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

// R weight rows x C activation rows: R * C accumulators + R widened weight vectors + 1 x vector
// <= 32 zmm registers (4 x 6: 24 + 4 + 1). Each step widens the R weight vectors once and
// multiplies each into the C activation rows. prefetch / prefetch_lines: as in block().
template <int R, int C, typename W>
DART_AVX512 void block512(const float* x, int64_t ldx, const W* w, float* y, int64_t N, int64_t K, int64_t n,
                          int64_t m, const char* prefetch = nullptr, int64_t prefetch_lines = 0) {
  __m512 acc[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  const int64_t body = K - K % 16;
  const int64_t lines_per_step = prefetch ? (prefetch_lines * 16 + body - 1) / std::max<int64_t>(body, 16) : 0;
  int64_t line = 0;
  const float* xr = x + m * ldx;
  const W* wr = w + n * K;
  for (int64_t k = 0; k < body; k += 16) {
    for (int64_t p = 0; p < lines_per_step && line < prefetch_lines; ++p, ++line)
      _mm_prefetch(prefetch + line * 64, _MM_HINT_T0);
    __m512 wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) wv[r] = load16(wr + r * K + k);
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      const __m512 xv = _mm512_loadu_ps(xr + c * ldx + k);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(xv, wv[r], acc[r][c]);
    }
  }
  if (body < K) {   // the K % 16 tail: one masked step, same lanes, same order for every row
    const __mmask16 mask = static_cast<__mmask16>((1u << (K - body)) - 1u);
    __m512 wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) wv[r] = load16(wr + r * K + body, mask);
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      const __m512 xv = load16(xr + c * ldx + body, mask);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(xv, wv[r], acc[r][c]);
    }
  }
  if constexpr (R % 4 == 0) {   // 4 outputs of a y row at a time (they are adjacent: weight rows n..n+3)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c)
#pragma GCC unroll 8
      for (int r = 0; r < R; r += 4)
        _mm_storeu_ps(y + (m + c) * N + n + r, hsum16x4(acc[r][c], acc[r + 1][c], acc[r + 2][c], acc[r + 3][c]));
  } else {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) y[(m + c) * N + n + r] = hsum16(acc[r][c]);
  }
}

// C activation rows against R weight rows with 256-bit operations, bit-identical to block512<R, C>:
// lanes 0-7 and 8-15 of the 16-lane sums live in two ymm accumulators (lo, hi), the same FMAs in the
// same order, joined into one zmm for the same reduction. Registers: 2 * R * C + 2 * C + 2 <= 32.
template <typename W>
DART_AVX512 inline __m256 load8m(const W* p, __mmask8 mask);
template <>
DART_AVX512 inline __m256 load8m(const float* p, __mmask8 mask) { return _mm256_maskz_loadu_ps(mask, p); }
template <>
DART_AVX512 inline __m256 load8m(const uint16_t* p, __mmask8 mask) {
  const __m128i h = _mm_maskz_loadu_epi16(mask, p);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
// [lo | hi] as one zmm (lanes 0-7, 8-15 of the 16-lane sums).
DART_AVX512 inline __m512 join(__m256 lo, __m256 hi) {
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}

template <int R, int C, typename W>
DART_AVX512 void block512_row(const float* x, int64_t ldx, const W* w, float* y, int64_t N, int64_t K, int64_t n,
                              int64_t m, const char* prefetch = nullptr, int64_t prefetch_lines = 0) {
  __m256 lo[R][C], hi[R][C];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) lo[r][c] = hi[r][c] = _mm256_setzero_ps();
  const int64_t body = K - K % 16;
  const int64_t lines_per_step = prefetch ? (prefetch_lines * 16 + body - 1) / std::max<int64_t>(body, 16) : 0;
  int64_t line = 0;
  const float* xr = x + m * ldx;
  const W* wr = w + n * K;
  for (int64_t k = 0; k < body; k += 16) {
    for (int64_t p = 0; p < lines_per_step && line < prefetch_lines; ++p, ++line)
      _mm_prefetch(prefetch + line * 64, _MM_HINT_T0);
    __m256 x0[C], x1[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      x0[c] = _mm256_loadu_ps(xr + c * ldx + k);
      x1[c] = _mm256_loadu_ps(xr + c * ldx + k + 8);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m256 w0 = load8(wr + r * K + k), w1 = load8(wr + r * K + k + 8);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) {
        lo[r][c] = _mm256_fmadd_ps(x0[c], w0, lo[r][c]);
        hi[r][c] = _mm256_fmadd_ps(x1[c], w1, hi[r][c]);
      }
    }
  }
  if (body < K) {
    const unsigned rem = static_cast<unsigned>(K - body);
    const __mmask8 m0 = static_cast<__mmask8>(rem >= 8 ? 0xFFu : (1u << rem) - 1u);
    const __mmask8 m1 = static_cast<__mmask8>(rem > 8 ? (1u << (rem - 8)) - 1u : 0u);
    __m256 x0[C], x1[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      x0[c] = load8m(xr + c * ldx + body, m0);
      x1[c] = load8m(xr + c * ldx + body + 8, m1);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m256 w0 = load8m(wr + r * K + body, m0), w1 = load8m(wr + r * K + body + 8, m1);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) {
        lo[r][c] = _mm256_fmadd_ps(x0[c], w0, lo[r][c]);
        hi[r][c] = _mm256_fmadd_ps(x1[c], w1, hi[r][c]);
      }
    }
  }
  if constexpr (R % 4 == 0) {
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c)
#pragma GCC unroll 16
      for (int r = 0; r < R; r += 4)
        _mm_storeu_ps(y + (m + c) * N + n + r,
                      hsum16x4(join(lo[r][c], hi[r][c]), join(lo[r + 1][c], hi[r + 1][c]),
                               join(lo[r + 2][c], hi[r + 2][c]), join(lo[r + 3][c], hi[r + 3][c])));
  } else {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) y[(m + c) * N + n + r] = hsum(_mm256_add_ps(lo[r][c], hi[r][c]));
  }
}

// All M activation rows against weight rows R at n: groups of C rows, then the remainder.
template <int R, int C, typename W>
DART_AVX512 void row_block512(const float* x, int64_t ldx, const W* w, float* y, int64_t M, int64_t N, int64_t K,
                              int64_t n, const char* next, int64_t lines) {
  static_assert(C == 6, "the remainder cases below are written for groups of 6");
  int64_t m = 0;
  // The first group also prefetches the next weight block.
  if (M >= C) {
    block512<R, C>(x, ldx, w, y, N, K, n, 0, next, lines);
    m = C;
  }
  for (; m + C <= M; m += C) block512<R, C>(x, ldx, w, y, N, K, n, m);
  const bool first = m == 0;
  const char* p = first ? next : nullptr;
  const int64_t pl = first ? lines : 0;
  switch (M - m) {
    case 5: block512<R, 5>(x, ldx, w, y, N, K, n, m, p, pl); break;
    case 4: block512<R, 4>(x, ldx, w, y, N, K, n, m, p, pl); break;
    case 3: block512<R, 3>(x, ldx, w, y, N, K, n, m, p, pl); break;
    case 2: block512<R, 2>(x, ldx, w, y, N, K, n, m, p, pl); break;
    case 1: block512<R, 1>(x, ldx, w, y, N, K, n, m, p, pl); break;
    default: break;
  }
}

// Many activation rows (a prompt's chunk of up to 256 rows, a large tree): the thread's weight rows are widened to
// float32 once per call, about 96 KiB at a time (in L2), and every group of 6 x rows passes every 4-row block of
// them. The groups-of-6 loop in rows_avx512 widens each block again for every group (8 of every 32 vector
// operations, on the FMA ports) and walks all M rows per weight block, so a prompt chunk of the MLP's down
// projection (256 x 1536 floats, 1.5 MiB) came from L3 once per 4 weight rows; here a group's rows stay in L1 while
// the weights pass. Each output is the same FMAs in the same order as block512 with bf16 loads (a widened bf16 value
// is exact): the same bits, and a row still equals itself computed alone. Measured on an Ice Lake Xeon VM (2
// threads, bundled SmolLM2 in bf16, a 700-token prompt, interleaved in one process): prefill 1.10-1.20x faster
// (482 -> 567 tokens/s in one run; the AVX2 version 1.10x). From 12 rows (many_rows), where the groups-of-6 loop
// widens twice.
template <typename W>
DART_AVX512 void rows_avx512_many(const float* x, int64_t ldx, const W* w, float* y, int64_t M, int64_t N,
                                  int64_t K, int64_t n0, int64_t n1) {
  constexpr bool bf16_weights = std::is_same<W, uint16_t>::value;
  const int64_t n4 = n0 + (n1 - n0) / 4 * 4;
  const int64_t step = many_rows_pass(K);
  thread_local std::vector<float> wide_buf;
  float* wide = nullptr;
  if constexpr (bf16_weights) {
    wide_buf.resize(static_cast<size_t>(std::min(step, n4 - n0) * K + 16));
    const uintptr_t at = reinterpret_cast<uintptr_t>(wide_buf.data());
    wide = wide_buf.data() + ((64 - at % 64) % 64) / sizeof(float);
  }
  for (int64_t a = n0; a < n4; a += step) {
    const int64_t b = std::min(n4, a + step);
    const float* wf;
    if constexpr (bf16_weights) {
      const int64_t total = (b - a) * K, body = total - total % 16;
      const uint16_t* wr = w + a * K;   // rows a..b-1 are contiguous
      for (int64_t i = 0; i < body; i += 16) _mm512_store_ps(wide + i, load16(wr + i));
      if (body < total) {
        const __mmask16 mask = static_cast<__mmask16>((1u << (total - body)) - 1u);
        _mm512_mask_storeu_ps(wide + body, mask, load16(wr + body, mask));
      }
      wf = wide;
    } else {
      wf = w + a * K;
    }
    for (int64_t m = 0; m < M; m += 6) {
      const int64_t c = std::min<int64_t>(6, M - m);
      for (int64_t n = a; n < b; n += 4) {
        const float* wb = wf + (n - a) * K;
        switch (c) {   // block512 writes y[(m + i) * N + r] of the y it is given: the block's outputs at column n
          case 6: block512<4, 6>(x, ldx, wb, y + n, N, K, 0, m); break;
          case 5: block512<4, 5>(x, ldx, wb, y + n, N, K, 0, m); break;
          case 4: block512<4, 4>(x, ldx, wb, y + n, N, K, 0, m); break;
          case 3: block512<4, 3>(x, ldx, wb, y + n, N, K, 0, m); break;
          case 2: block512<4, 2>(x, ldx, wb, y + n, N, K, 0, m); break;
          default: block512<4, 1>(x, ldx, wb, y + n, N, K, 0, m); break;
        }
      }
    }
  }
  for (int64_t n = n4; n < n1; ++n) row_block512<1, 6>(x, ldx, w, y, M, N, K, n, nullptr, 0);
}

template <typename W>
DART_AVX512 void rows_avx512(const float* x, int64_t ldx, const W* w, float* y, int64_t M, int64_t N, int64_t K,
                             int64_t n0, int64_t n1, bool gemv_prefetch) {
  int64_t n = n0;
  if (M <= 3) {
    // A plain decoding step (M = 1) and the smallest trees stream the weights from memory with little
    // arithmetic per byte: 4 weight rows at a time with 256-bit operations in the 16-lane order
    // (bit-identical to block512), prefetching the 4 rows after the next 4 (the AVX2 kernel's distance;
    // the next 4 measured 5-15% slower at M = 1). Measured on Zen 4 streaming the 49152 x 576 LM head
    // from memory, interleaved A/B against the AVX2 kernel: 512-bit loads ran 0.80-0.91x (M = 1..3),
    // these 0.94-1.1x. 8 rows in flight (prefetching the 8 after the next 8) measured 0.96-0.98x these at M = 1
    // on an Emerald Rapids VM (weights from memory, 1 and 2 threads, interleaved in one process). There, one row
    // with 512-bit operations (block512<4, 1>, the same FMAs in the same lanes: the same bits) streamed 71% of the
    // read bandwidth against 65-68% (tree_cost.py-style sweep of the decoder's matrices, 2 threads), and a prefetch
    // distance of 16 or 32 rows, none, or one past the end of the thread's chunk all measured worse than 8; so Intel
    // CPUs run M = 1 with zmm operations. M = 2, 3 too: on the same VM a verify of 2 and 3 nodes cost 1.14x and
    // 1.24x one token with the 256-bit blocks (4 nodes, on block512: 1.21x) and 1.07-1.10x / 1.15x with these.
    static const bool intel = __builtin_cpu_is("intel");
    const int64_t block_lines = static_cast<int64_t>(4 * K * sizeof(W) + 63) / 64;
    for (; n + 4 <= n1; n += 4) {
      const char* next = (M > 1 || gemv_prefetch) && n + 12 <= n1 ? reinterpret_cast<const char*>(w + (n + 8) * K)
                                                                     : nullptr;
      const int64_t lines = next ? block_lines : 0;
      if (intel && !legacy_mode.load(std::memory_order_relaxed)) {
        if (M == 1) block512<4, 1>(x, ldx, w, y, N, K, n, 0, next, lines);
        else if (M == 2) block512<4, 2>(x, ldx, w, y, N, K, n, 0, next, lines);
        else block512<4, 3>(x, ldx, w, y, N, K, n, 0, next, lines);
      } else if (M == 1) block512_row<4, 1>(x, ldx, w, y, N, K, n, 0, next, lines);
      else if (M == 2) block512_row<4, 2>(x, ldx, w, y, N, K, n, 0, next, lines);
      else block512_row<4, 3>(x, ldx, w, y, N, K, n, 0, next, lines);
    }
    for (; n < n1; ++n)
      for (int64_t m = 0; m < M; ++m) block512_row<1, 1>(x, ldx, w, y, N, K, n, m);
    return;
  }
  if (M >= many_rows.load(std::memory_order_relaxed)) return rows_avx512_many(x, ldx, w, y, M, N, K, n0, n1);
  // Each 4-row weight block stays in L1 while every group of 6 x rows passes; it is widened once
  // per group. 8 weight rows x 3 x rows (the other 24-accumulator shape) measured the same on Zen 4;
  // 4 x 6 widens half as often.
  const int64_t block_lines = static_cast<int64_t>(4 * K * sizeof(W) + 63) / 64;
  for (; n + 4 <= n1; n += 4) {
    const char* next = n + 8 <= n1 ? reinterpret_cast<const char*>(w + (n + 4) * K) : nullptr;
    row_block512<4, 6>(x, ldx, w, y, M, N, K, n, next, next ? block_lines : 0);
  }
  for (; n < n1; ++n) row_block512<1, 6>(x, ldx, w, y, M, N, K, n, nullptr, 0);
}
#endif

#ifdef DART_X86
// ---- AVX512-BF16: bf16 dot products (VDPBF16PS), bf16 weights only ----------------------------------------------
// The activations are rounded to bf16 once per call (round to nearest even, VCVTNE2PS2BF16) into rows of ldb
// elements, zero-padded to a multiple of 32; every step multiplies 32 bf16 activations by 32 bf16 weights (exact
// products) and adds each pair into one of 16 float32 lane sums. Summation order of one output (fixed by K alone):
// the 16 lane sums over the 32-wide steps of the body, then the K % 32 tail as one more step (the weights masked,
// the activations zero past K), then hsum16. Blocking never changes it, so a row does not depend on M, nor on the
// other rows of the call. The weights are used as loaded: no widening.
#define DART_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))

// x [M, K] float32 -> xb [M, ldb] bf16 bit patterns, ldb = K rounded up to 32, zeros past K.
DART_AVX512BF16 void pack_bf16_rows(const float* x, int64_t M, int64_t K, int64_t ldb, uint16_t* xb) {
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * K;
    uint16_t* o = xb + m * ldb;
    for (int64_t k = 0; k < ldb; k += 32) {
      const int64_t left = K - k;
      const __mmask16 lo = static_cast<__mmask16>(left >= 16 ? 0xFFFFu : left > 0 ? (1u << left) - 1u : 0u);
      const __mmask16 hi = static_cast<__mmask16>(left >= 32 ? 0xFFFFu : left > 16 ? (1u << (left - 16)) - 1u : 0u);
      const __m512 a = _mm512_maskz_loadu_ps(lo, xr + k), b = _mm512_maskz_loadu_ps(hi, xr + k + 16);
      const __m512bh v = _mm512_cvtne2ps_pbh(b, a);   // elements 0-15 from a, 16-31 from b
      _mm512_storeu_si512(o + k, reinterpret_cast<const __m512i&>(v));
    }
  }
}

DART_AVX512BF16 inline __m512bh as_bh(__m512i v) { return reinterpret_cast<__m512bh&>(v); }

// R weight rows x C activation rows: R * C accumulators + R weight vectors + 1 activation vector <= 32 registers.
template <int R, int C>
DART_AVX512BF16 void block_bf16dp(const uint16_t* xb, int64_t ldb, const uint16_t* w, float* y, int64_t N,
                                  int64_t K, int64_t n, int64_t m, const char* prefetch = nullptr,
                                  int64_t prefetch_lines = 0) {
  __m512 acc[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  const int64_t body = K - K % 32;
  const int64_t lines_per_step = prefetch ? (prefetch_lines * 32 + body - 1) / std::max<int64_t>(body, 32) : 0;
  int64_t line = 0;
  const uint16_t* xr = xb + m * ldb;
  const uint16_t* wr = w + n * K;
  for (int64_t k = 0; k < body; k += 32) {
    for (int64_t p = 0; p < lines_per_step && line < prefetch_lines; ++p, ++line)
      _mm_prefetch(prefetch + line * 64, _MM_HINT_T0);
    __m512i wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) wv[r] = _mm512_loadu_si512(wr + r * K + k);
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      const __m512bh xv = as_bh(_mm512_loadu_si512(xr + c * ldb + k));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, as_bh(wv[r]));
    }
  }
  if (body < K) {   // the K % 32 tail: one masked step, the same lanes for every row
    const __mmask32 mask = static_cast<__mmask32>((1ull << (K - body)) - 1ull);
    __m512i wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) wv[r] = _mm512_maskz_loadu_epi16(mask, wr + r * K + body);
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      const __m512bh xv = as_bh(_mm512_loadu_si512(xr + c * ldb + body));   // zeros past K (packed)
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, as_bh(wv[r]));
    }
  }
  if constexpr (R % 4 == 0) {
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c)
#pragma GCC unroll 8
      for (int r = 0; r < R; r += 4)
        _mm_storeu_ps(y + (m + c) * N + n + r, hsum16x4(acc[r][c], acc[r + 1][c], acc[r + 2][c], acc[r + 3][c]));
  } else {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) y[(m + c) * N + n + r] = hsum16(acc[r][c]);
  }
}

// Four weight rows one after the other (each row's k loop ends before the next begins: one sequential run of
// weights), C activation rows against each, the four rows' sums reduced together (hsum16x4: the bits of hsum16).
// prefetch: row n + r + 2 while row n + r runs, where it lies before n1. 4 * C + 2 <= 32 registers.
template <int C>
DART_AVX512BF16 void rows4_bf16dp(const uint16_t* xb, int64_t ldb, const uint16_t* w, float* y, int64_t N, int64_t K,
                                  int64_t n, int64_t n1, bool prefetch) {
  __m512 acc[4][C];
  const int64_t body = K - K % 32;
  const int64_t row_lines = (K * 2 + 63) / 64;
  const int64_t lines_per_step = (row_lines * 32 + body - 1) / std::max<int64_t>(body, 32);
  const __mmask32 tail = static_cast<__mmask32>((1ull << (K - body)) - 1ull);
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) {
    const uint16_t* wr = w + (n + r) * K;
    const char* next = prefetch && n + r + 2 < n1 ? reinterpret_cast<const char*>(w + (n + r + 2) * K) : nullptr;
    int64_t line = 0;
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    for (int64_t k = 0; k < body; k += 32) {
      if (next)
        for (int64_t p = 0; p < lines_per_step && line < row_lines; ++p, ++line) _mm_prefetch(next + line * 64, _MM_HINT_T0);
      const __m512i wv = _mm512_loadu_si512(wr + k);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c)
        acc[r][c] = _mm512_dpbf16_ps(acc[r][c], as_bh(_mm512_loadu_si512(xb + c * ldb + k)), as_bh(wv));
    }
    if (body < K) {   // the K % 32 tail, as in block_bf16dp
      const __m512i wv = _mm512_maskz_loadu_epi16(tail, wr + body);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c)
        acc[r][c] = _mm512_dpbf16_ps(acc[r][c], as_bh(_mm512_loadu_si512(xb + c * ldb + body)), as_bh(wv));
    }
  }
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) _mm_storeu_ps(y + c * N + n, hsum16x4(acc[0][c], acc[1][c], acc[2][c], acc[3][c]));
}

// All M packed activation rows against weight rows [n0, n1): M <= 7 streams the weight rows one after the other, four
// at a time (rows4_bf16dp), M >= 8 runs 4 weight rows side by side against groups of 6 activation rows (the block
// stays in L1 while the groups pass).
DART_AVX512BF16 void rows_avx512bf16(const uint16_t* xb, int64_t ldb, const uint16_t* w, float* y, int64_t M,
                                     int64_t N, int64_t K, int64_t n0, int64_t n1, bool gemv_prefetch) {
  int64_t n = n0;
  if (M <= 7) {
    // A plain step or a small tree: one sequential run of weights per thread. Measured on a 2-vCPU Zen 4 EPYC, 2
    // threads: at M = 1 rows one by one with row n + 2 prefetched took 6.8-7.1 ms against 8.1-8.4 ms for blocks of 8
    // rows (the decoder's weights); at M = 2-7, with no software prefetch (the hardware's stream prefetcher keeps
    // up here; the blocks need theirs, 1.1-1.3x slower without), a verify in place (tree_cost.py, prefix 300) costs
    // 1.05 / 1.15 / 1.30 / 1.38 / 1.45x a plain step at 2 / 3 / 4 / 5 / 7 nodes against 1.27 / 1.24 / 1.33 / 1.49 /
    // 1.57x with the blocks (8 x 2 at M = 2). From M = 8 the blocks win (rows of 2 x M: 1.16x at 8 and 9): each
    // activation load here feeds one product, there four.
    for (; n + 4 <= n1; n += 4) {
      switch (M) {
        case 1: rows4_bf16dp<1>(xb, ldb, w, y, N, K, n, n1, gemv_prefetch); break;
        case 2: rows4_bf16dp<2>(xb, ldb, w, y, N, K, n, n1, false); break;
        case 3: rows4_bf16dp<3>(xb, ldb, w, y, N, K, n, n1, false); break;
        case 4: rows4_bf16dp<4>(xb, ldb, w, y, N, K, n, n1, false); break;
        case 5: rows4_bf16dp<5>(xb, ldb, w, y, N, K, n, n1, false); break;
        case 6: rows4_bf16dp<6>(xb, ldb, w, y, N, K, n, n1, false); break;
        default: rows4_bf16dp<7>(xb, ldb, w, y, N, K, n, n1, false); break;
      }
    }
  } else {
    const int64_t block_lines = (4 * K * 2 + 63) / 64;
    // The next block's prefetches go out during the first group of 6 activation rows; with exactly two groups
    // (M = 7-12) half during each. Measured on a Zen 5 EPYC sweeping the decoder's weights, 120 interleaved pairs,
    // three runs: M = 9 0.94-0.96x, 10 0.96-0.98x, 7-8 and 11-12 0.98-1.01x; spread over three groups (M = 13-17) it
    // measured 1.02-1.06x, so those keep them in the first.
    const int64_t split = M > 6 && M <= 12 ? block_lines / 2 : block_lines;
    for (; n + 4 <= n1; n += 4) {
      const char* next = n + 8 <= n1 ? reinterpret_cast<const char*>(w + (n + 4) * K) : nullptr;
      // The group starting at activation row m prefetches lines [first_line(m), end_line(m)) of the next block.
      auto first_line = [&](int64_t m) { return m == 0 ? 0 : m == 6 ? split : block_lines; };
      auto end_line = [&](int64_t m) { return m == 0 ? split : block_lines; };
      auto from = [&](int64_t m) { return next && end_line(m) > first_line(m) ? next + first_line(m) * 64 : nullptr; };
      auto count = [&](int64_t m) { return from(m) ? end_line(m) - first_line(m) : 0; };
      int64_t m = 0;
      for (; m + 6 <= M; m += 6) block_bf16dp<4, 6>(xb, ldb, w, y, N, K, n, m, from(m), count(m));
      const char* p = from(m);
      const int64_t pl = count(m);
      switch (M - m) {
        case 5: block_bf16dp<4, 5>(xb, ldb, w, y, N, K, n, m, p, pl); break;
        case 4: block_bf16dp<4, 4>(xb, ldb, w, y, N, K, n, m, p, pl); break;
        case 3: block_bf16dp<4, 3>(xb, ldb, w, y, N, K, n, m, p, pl); break;
        case 2: block_bf16dp<4, 2>(xb, ldb, w, y, N, K, n, m, p, pl); break;
        case 1: block_bf16dp<4, 1>(xb, ldb, w, y, N, K, n, m, p, pl); break;
        default: break;
      }
    }
  }
  for (; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m) block_bf16dp<1, 1>(xb, ldb, w, y, N, K, n, m);
}

// ---- AMX-BF16: tiles of 16 weight rows x 32 k (TDPBF16PS), bf16 weights only --------------------------------
// The activations are rounded to bf16 as on the AVX512-BF16 path (pack_bf16_rows), then laid out as the tile
// product's B operand (pack_amx_b); the weights are the A operand, loaded as they lie in memory (16 rows of 64 bytes
// at the matrix's stride), so no weight is repacked or copied, except the K % 32 tail of a row block and a last block
// of fewer than 16 rows, which are copied into zero-padded tiles. One output is summed over the 32-wide k blocks in
// order, one TDPBF16PS each, into its own float32 element of a C tile: its value depends on its weight row and its
// activation row only, never on M, the blocking or the other rows in the tile. All eight tiles are 16 rows x 64 bytes
// (one configuration, loaded at the start of every range a thread runs: other code on the thread, oneDNN say, may
// have changed it).
#define DART_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))

struct alignas(64) AmxTileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  AmxTileConfig() {
    for (int t = 0; t < 8; ++t) { colsb[t] = 64; rows[t] = 16; }
  }
};

// 0, step, 2 step, ..., 15 step: the 32-bit lane offsets of a gather down a column of 16 rows `step` elements apart.
DART_AMX inline __m512i lane_offsets(int64_t step) {
  return _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                            _mm512_set1_epi32(static_cast<int>(step)));
}

// xb [M, ldb] bf16 rows (ldb a multiple of 32, zeros past K) -> B tiles: for column block cb (activation rows
// 16cb..16cb+15) and k block kb, 16 rows p of 16 dwords, dword c holding x[16cb + c][32kb + 2p .. 32kb + 2p + 1];
// zeros for rows past M.
DART_AMX void pack_amx_b(const uint16_t* xb, int64_t ldb, int64_t M, uint32_t* out) {
  const int64_t KB = ldb / 32, CB = (M + 15) / 16, row_dwords = ldb / 2;
  // One gather per tile row: dword p of the 16 activation rows' k block, rows past M masked to zero (no memset).
  // Against one scalar store per dword into a zeroed buffer, a call per decoder matrix of the bundled model (210,
  // interleaved, 2 threads): 8 rows 8.77 -> 8.19 ms, 16 rows 10.15 -> 9.17 ms, one row the same.
  const __m512i rows = lane_offsets(row_dwords);
  const uint32_t* src = reinterpret_cast<const uint32_t*>(xb);
  for (int64_t cb = 0; cb < CB; ++cb) {
    const int64_t live = std::min<int64_t>(16, M - cb * 16);
    const __mmask16 mask = static_cast<__mmask16>((1u << live) - 1u);
    const uint32_t* base = src + cb * 16 * row_dwords;
    if (live == 1) {   // one activation row (a plain step): its k block loaded once, dword p moved to lane 0
      for (int64_t kb = 0; kb < KB; ++kb) {
        const __m512i row = _mm512_loadu_si512(base + kb * 16);
        for (int64_t p = 0; p < 16; ++p)
          _mm512_store_si512(out + ((cb * KB + kb) * 16 + p) * 16,
                             _mm512_maskz_permutexvar_epi32(1, _mm512_set1_epi32(static_cast<int>(p)), row));
      }
      continue;
    }
    for (int64_t kb = 0; kb < KB; ++kb)
      for (int64_t p = 0; p < 16; ++p) {
        const __m512i idx = _mm512_add_epi32(rows, _mm512_set1_epi32(static_cast<int>(kb * 16 + p)));
        const __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mask, idx, base, 4);
        _mm512_store_si512(out + ((cb * KB + kb) * 16 + p) * 16, v);
      }
  }
}

// 16 weight rows (w: the first, ldw elements apart) against every column block of B: kfull k blocks read from w
// where it lies, then, when K % 32 != 0, one more from tail (16 rows of 32, zero-padded). Tiles: C 0, A 4, B 6.
// One block of 16 rows at a time, no software prefetch: measured on a 2-vCPU Xeon with AMX (one row through the
// bundled model's decoder weights, bf16, 2 threads), 85-88% of the read bandwidth, against 75-84% for blocks of 64
// rows (4 C tiles) with or without prefetching the next block, and trees of 3-17 rows no slower (tree_cost.py).
DART_AMX void amx_block(const uint32_t* xv, int64_t KB, int64_t CB, int64_t M, const uint16_t* w, int64_t ldw,
                        int64_t kfull, const uint16_t* tail, int64_t valid_rows, float* y, int64_t N, int64_t n) {
  alignas(64) float c[16][16];
  const int64_t stride = ldw * 2;
  const __m512i column = lane_offsets(16);   // column j of c: c[0][j], c[1][j], ...
  const __mmask16 rows_mask = static_cast<__mmask16>((1u << valid_rows) - 1u);
  for (int64_t cb = 0; cb < CB; ++cb) {
    const uint32_t* b = xv + cb * KB * 256;
    _tile_zero(0);
    for (int64_t kb = 0; kb < kfull; ++kb) {
      _tile_loadd(6, b + kb * 256, 64);
      _tile_loadd(4, w + kb * 32, stride);
      _tile_dpbf16ps(0, 4, 6);
    }
    if (tail) {
      _tile_loadd(6, b + kfull * 256, 64);
      _tile_loadd(4, tail, 64);
      _tile_dpbf16ps(0, 4, 6);
    }
    _tile_stored(0, c[0], 64);
    const int64_t cols = std::min<int64_t>(16, M - cb * 16);
    for (int64_t j = 0; j < cols; ++j) {   // column j of C: output row 16cb + j, weight rows n..n+15
      const __m512 v = _mm512_i32gather_ps(_mm512_add_epi32(column, _mm512_set1_epi32(static_cast<int>(j))), c[0], 4);
      _mm512_mask_storeu_ps(y + (cb * 16 + j) * N + n, rows_mask, v);
    }
  }
}

DART_AMX void rows_amx(const uint32_t* xv, int64_t ldb, const uint16_t* w, float* y, int64_t M, int64_t N, int64_t K,
                       int64_t n0, int64_t n1) {
  // Always 16 activation columns (zeros past M): configuring only M of them measured no faster.
  static const AmxTileConfig config;
  _tile_loadconfig(&config);
  const int64_t KB = ldb / 32, CB = (M + 15) / 16, kfull = K / 32;
  const bool has_tail = kfull < KB;
  alignas(64) uint16_t tail[16 * 32];
  int64_t n = n0;
  for (; n + 16 <= n1; n += 16) {
    if (has_tail) {
      std::memset(tail, 0, sizeof tail);
      for (int64_t r = 0; r < 16; ++r)
        std::memcpy(tail + r * 32, w + (n + r) * K + kfull * 32, static_cast<size_t>(K - kfull * 32) * 2);
    }
    amx_block(xv, KB, CB, M, w + n * K, K, kfull, has_tail ? tail : nullptr, 16, y, N, n);
  }
  if (n < n1) {   // fewer than 16 rows left: copied into a zero-padded block of 16 rows of ldb columns
    thread_local std::vector<uint16_t> pad_buf;
    pad_buf.assign(static_cast<size_t>(16 * ldb + 32), 0);
    const uintptr_t at = reinterpret_cast<uintptr_t>(pad_buf.data());
    uint16_t* pad = pad_buf.data() + ((64 - at % 64) % 64) / sizeof(uint16_t);
    for (int64_t r = 0; r < n1 - n; ++r) std::memcpy(pad + r * ldb, w + (n + r) * K, static_cast<size_t>(K) * 2);
    amx_block(xv, KB, CB, M, pad, ldb, KB, nullptr, n1 - n, y, N, n);
  }
}

// Whether this CPU has AMX-BF16 and the OS lets this process use the tile registers (Linux asks for them per
// process: arch_prctl(ARCH_REQ_XCOMP_PERM), kernel 5.16 and later).
bool amx_available() {
  static const bool ok = [] {
#if defined(__linux__)
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool tile = d & (1u << 24), bf16 = d & (1u << 22);
    if (!tile || !bf16) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
  }();
  return ok;
}
#endif



// ---- the thread pool of parallel_items -------------------------------------------------------------------------
// One job at a time. state packs the job's generation (24 bits), its thread count (8), its item count (16) and the
// next unclaimed item (16): a worker claims item i of generation g by one compare-exchange from (g, t, n, i) to
// (g, t, n, i + 1), so it can never claim an item of a job that has ended (the generation differs) and reads the job
// (fn, ctx) only after a successful claim, while the caller still waits for that item. Idle workers spin for
// DART_POOL_SPIN_US microseconds (default 300: longer than the gaps between a decoding step's GEMMs), then sleep.
class Pool {
 public:
  void run(int threads, int64_t total, void (*fn)(void*, int64_t), void* ctx) {
    std::unique_lock<std::mutex> busy(call_mutex_, std::try_to_lock);
    if (!busy.owns_lock()) {   // another thread's call is in flight: run this one here
      for (int64_t i = 0; i < total; ++i) fn(ctx, i);
      return;
    }
    threads = std::min(threads, 255);
    while (static_cast<int>(workers_) < threads - 1) {
      std::thread(&Pool::worker, this, static_cast<int>(workers_)).detach();
      ++workers_;
    }
    fn_ = fn;
    ctx_ = ctx;
    done_.store(0, std::memory_order_relaxed);
    gen_ = (gen_ + 1) & 0xFFFFFFu;
    state_.store((static_cast<uint64_t>(gen_) << 40) | (static_cast<uint64_t>(threads) << 32) |
                 (static_cast<uint64_t>(total) << 16), std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      { std::lock_guard<std::mutex> lock(sleep_mutex_); }
      wake_.notify_all();
    }
    int64_t mine = 0;
    work(gen_, &mine);
    while (done_.load(std::memory_order_acquire) + mine < total) pause();
  }

 private:
  static uint32_t gen_of(uint64_t s) { return static_cast<uint32_t>(s >> 40); }
  static int threads_of(uint64_t s) { return static_cast<int>((s >> 32) & 0xFF); }
  static int64_t total_of(uint64_t s) { return static_cast<int64_t>((s >> 16) & 0xFFFF); }
  static int64_t next_of(uint64_t s) { return static_cast<int64_t>(s & 0xFFFF); }
  static void pause() {
#ifdef DART_X86
    _mm_pause();
#else
    std::this_thread::yield();
#endif
  }

  // Claims and runs items of generation gen until none is left; counts them in *ran (the caller) or done_.
  void work(uint32_t gen, int64_t* ran) {
    uint64_t s = state_.load(std::memory_order_acquire);
    while (gen_of(s) == gen && next_of(s) < total_of(s)) {
      if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      fn_(ctx_, next_of(s));
      if (ran) ++*ran;
      else done_.fetch_add(1, std::memory_order_release);
      s = state_.load(std::memory_order_acquire);
    }
  }

  void worker(int id) {
    uint32_t seen = gen_of(state_.load(std::memory_order_acquire));
    const auto spin = std::chrono::microseconds(spin_us());
    for (;;) {
      uint64_t s = state_.load(std::memory_order_acquire);
      if (gen_of(s) == seen) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0;; ++i) {
          pause();
          s = state_.load(std::memory_order_acquire);
          if (gen_of(s) != seen) break;
          if ((i & 255) == 255 && std::chrono::steady_clock::now() - t0 > spin) {
            std::unique_lock<std::mutex> lock(sleep_mutex_);
            sleepers_.fetch_add(1, std::memory_order_seq_cst);
            wake_.wait(lock, [&] { return gen_of(state_.load(std::memory_order_seq_cst)) != seen; });
            sleepers_.fetch_sub(1, std::memory_order_seq_cst);
            s = state_.load(std::memory_order_acquire);
            break;
          }
        }
      }
      seen = gen_of(s);
      if (id < threads_of(s) - 1) work(seen, nullptr);
    }
  }

  static long spin_us() {
    const char* v = std::getenv("DART_POOL_SPIN_US");
    return v ? std::max(0L, std::atol(v)) : 300L;
  }

  std::mutex call_mutex_;
  unsigned workers_ = 0;
  uint32_t gen_ = 0;
  void (*fn_)(void*, int64_t) = nullptr;
  void* ctx_ = nullptr;
  std::atomic<uint64_t> state_{0};
  std::atomic<int64_t> done_{0};
  std::atomic<int> sleepers_{0};
  std::mutex sleep_mutex_;
  std::condition_variable wake_;
};

// Never destroyed (detached workers may still wait on it at exit); a forked child starts a new one (the parent's
// workers do not exist there, and its mutexes may be held).
Pool* the_pool = nullptr;
std::once_flag pool_once;
Pool& pool() {
  std::call_once(pool_once, [] {
    the_pool = new Pool();
#ifdef DART_PTHREAD
    pthread_atfork(nullptr, nullptr, [] { the_pool = new Pool(); });
#endif
  });
  return *the_pool;
}

template <typename W>
void run(const float* x, const W* w, float* y, int64_t M, int64_t N, int64_t K, int threads) {
  // The weight rows are cut into chunks of consecutive rows (multiples of 8, about kChunkBytes of weights each, at
  // least 2 per thread) that the threads claim in order (parallel_items): each thread streams whole chunks, and a
  // thread the OS has not scheduled yet (a busy machine) leaves its chunks to the others instead of holding the
  // call up. An output does not depend on which thread or chunk computes it (the summation order is fixed by K).
  // An empty product writes nothing; the multi-row kernels start with 2 rows in the AVX2 path, so
  // M = 0 must never reach them (it once wrote two rows past a 0-row y).
  if (M <= 0 || N <= 0) return;
  const GemmPath path = small_gemm_path();
  // The AVX-512 kernel loads one 64-byte line per x vector: rows that do not start on a line boundary
  // split every such load in two (measured on Zen 4, 4 x rows of 576: 24-27 against 40 G multiply-adds/s).
  // Such an x is copied once per call into 64-byte aligned rows, the stride rounded up to 16 floats: M * K
  // copies against M * N * K multiply-adds, and the values, so the results, are unchanged. One row (the
  // decoding step) is read from L1 by 256-bit loads and runs as it is.
  const float* xa = x;
  int64_t ldx = K;
  constexpr bool bf16_weights = std::is_same<W, uint16_t>::value;
  // The AVX512-BF16 path runs float32 weights through the float32 AVX-512 kernel (the same results).
  // So does the AMX path.
  const bool amx = bf16_weights && path == GemmPath::Amx;
  const bool dp_bf16 = bf16_weights && path == GemmPath::Avx512Bf16;
  const bool f32_512 = path == GemmPath::Avx512 ||
                       ((path == GemmPath::Avx512Bf16 || path == GemmPath::Amx) && !bf16_weights);
  const uint16_t* xb = nullptr;
  int64_t ldb = 0;
#ifdef DART_X86
  thread_local std::vector<uint16_t> packed_bf16;
  thread_local std::vector<uint32_t> packed_amx;
  const uint32_t* xv = nullptr;
  if (dp_bf16 || amx) {   // the activations rounded to bf16 once per call, rows 64-byte aligned
    ldb = (K + 31) / 32 * 32;
    packed_bf16.resize(static_cast<size_t>(M * ldb + 32));
    const uintptr_t at = reinterpret_cast<uintptr_t>(packed_bf16.data());
    uint16_t* base = packed_bf16.data() + ((64 - at % 64) % 64) / sizeof(uint16_t);
    pack_bf16_rows(x, M, K, ldb, base);
    xb = base;
  }
  if (amx) {   // and laid out as B tiles
    packed_amx.resize(static_cast<size_t>((M + 15) / 16 * ldb * 16 + 16));
    const uintptr_t at = reinterpret_cast<uintptr_t>(packed_amx.data());
    uint32_t* base = packed_amx.data() + ((64 - at % 64) % 64) / sizeof(uint32_t);
    pack_amx_b(xb, ldb, M, base);
    xv = base;
  }
  thread_local std::vector<float> packed;
  if (f32_512 && M >= 2 && (reinterpret_cast<uintptr_t>(x) % 64 != 0 || K % 16 != 0)) {
    ldx = (K + 15) / 16 * 16;
    packed.resize(static_cast<size_t>(M * ldx + 16));
    const uintptr_t at = reinterpret_cast<uintptr_t>(packed.data());
    float* base = packed.data() + ((64 - at % 64) % 64) / sizeof(float);
    for (int64_t m = 0; m < M; ++m) std::memcpy(base + m * ldx, x + m * K, static_cast<size_t>(K) * sizeof(float));
    xa = base;
  }
#endif
  const bool gemv_prefetch = gemv_prefetch_on[static_cast<int>(path)].load(std::memory_order_relaxed);
  auto rows = [&](int64_t n0, int64_t n1) {
#ifdef DART_X86
    if constexpr (bf16_weights) {
      if (amx) return rows_amx(xv, ldb, w, y, M, N, K, n0, n1);
      if (dp_bf16) return rows_avx512bf16(xb, ldb, w, y, M, N, K, n0, n1, gemv_prefetch);
    }
    if (f32_512) return rows_avx512(xa, ldx, w, y, M, N, K, n0, n1, gemv_prefetch);
    if (path == GemmPath::Avx2) return rows_avx2(x, w, y, M, N, K, n0, n1, gemv_prefetch);
#endif
    rows_portable(x, w, y, M, N, K, n0, n1);
  };
  (void)path;
  (void)xa;
  (void)ldx;
  (void)xb;
  (void)ldb;
  (void)dp_bf16;
  (void)amx;
  (void)xv;
  (void)f32_512;
  (void)gemv_prefetch;
  if (threads <= 1 || N < 64) return rows(0, N);
#ifdef _OPENMP
  if (legacy_mode.load(std::memory_order_relaxed)) {   // as before the pool: equal ranges, a region per call
    const int64_t per = ((N + threads - 1) / threads + 7) / 8 * 8;
#pragma omp parallel for num_threads(threads) schedule(static, 1)
    for (int t = 0; t < threads; ++t) {
      const int64_t n0 = std::min<int64_t>(N, t * per), n1 = std::min<int64_t>(N, n0 + per);
      if (n0 < n1) rows(n0, n1);
    }
    return;
  }
#endif
  // 48 KiB: 16 KiB measured 60% of the read bandwidth (one-row sweep), 48-128 KiB 66-68%, 512 KiB 72% in a run whose
  // read was slower (Emerald Rapids VM, 2 threads); smaller chunks balance better on a busy machine.
  constexpr int64_t kChunkBytes = 48 << 10;
  const int64_t row_bytes = std::max<int64_t>(1, K * static_cast<int64_t>(sizeof(W)));
  // Multiples of 8 rows; of 16 on the AMX path (its tiles' rows).
  const int64_t unit = amx ? 16 : 8;
  int64_t chunk = std::max<int64_t>(unit, (kChunkBytes / row_bytes + unit - 1) / unit * unit);
  chunk = std::min(chunk, std::max<int64_t>(unit, (N / (2 * threads) + unit - 1) / unit * unit));
  while ((N + chunk - 1) / chunk > 4096) chunk *= 2;
  const int64_t chunks = (N + chunk - 1) / chunk;
  parallel_for_items(threads, chunks, [&](int64_t i) { rows(i * chunk, std::min(N, (i + 1) * chunk)); });
}

// The forced path (-1: none, use DART_GEMM_PATH or the best).
std::atomic<int> forced_path{-1};


GemmPath clamp_to_cpu(GemmPath want) {
  return static_cast<GemmPath>(std::min(static_cast<int>(want), static_cast<int>(small_gemm_best_path())));
}

// DART_GEMM_PATH, read once: the path it names (clamped to this CPU), or the default when it names none.
struct EnvPath {
  GemmPath path;
  bool named;   // the variable named a path (not unset, "auto" or unknown)
};

const EnvPath& env_choice() {
  static const EnvPath e = [] {
    const char* v = std::getenv("DART_GEMM_PATH");
    const std::string name = v ? v : "";
    if (name.empty() || name == "auto") return EnvPath{small_gemm_default_path(), false};
    GemmPath q;
    if (small_gemm_path_from_name(name, &q)) return EnvPath{clamp_to_cpu(q), true};
    std::fprintf(stderr, "DART_GEMM_PATH=%s is not one of amx, avx512bf16, avx512, avx2, portable, auto: ignored\n", v);
    return EnvPath{small_gemm_default_path(), false};
  }();
  return e;
}

GemmPath env_path() { return env_choice().path; }

}  // namespace

void small_gemm_set_legacy(bool on) { legacy_mode.store(on, std::memory_order_relaxed); }

void small_gemm_set_many_rows(int64_t rows) { many_rows.store(std::max<int64_t>(1, rows), std::memory_order_relaxed); }
int64_t small_gemm_many_rows() { return many_rows.load(std::memory_order_relaxed); }

void small_gemm_set_gemv_prefetch(GemmPath path, bool on) {
  gemv_prefetch_on[static_cast<int>(path)].store(on, std::memory_order_relaxed);
}
bool small_gemm_gemv_prefetch(GemmPath path) {
  return gemv_prefetch_on[static_cast<int>(path)].load(std::memory_order_relaxed);
}

void parallel_items(int threads, int64_t total, void (*fn)(void*, int64_t), void* ctx) {
  thread_local bool inside = false;   // a nested call (from an item) runs on its own thread
  if (threads <= 1 || total <= 1 || inside) {
    for (int64_t i = 0; i < total; ++i) fn(ctx, i);
    return;
  }
  if (total >= 65536) throw std::invalid_argument("parallel_items: total must be < 65536");
  inside = true;
  try {
    pool().run(threads, total, fn, ctx);
  } catch (...) {
    inside = false;
    throw;
  }
  inside = false;
}

bool small_gemm_has_avx2() {
#ifdef DART_X86
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
#else
  return false;
#endif
}

GemmPath small_gemm_best_path_for(bool avx2, bool avx512, bool avx512bf16, bool amx) {
  if (!avx2) return GemmPath::Portable;
  if (!avx512) return GemmPath::Avx2;
  if (!avx512bf16) return GemmPath::Avx512;
  return amx ? GemmPath::Amx : GemmPath::Avx512Bf16;
}

GemmPath small_gemm_best_path() {
#ifdef DART_X86
  static const GemmPath best = [] {
    // __builtin_cpu_supports also checks that the OS saves the zmm / ymm state (XGETBV).
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl");
    const bool bf16 = avx512 && __builtin_cpu_supports("avx512bf16");
    // The tiles are asked of the OS only where the AMX kernel could run (it needs AVX512-BF16 too).
    return small_gemm_best_path_for(small_gemm_has_avx2(), avx512, bf16, bf16 && amx_available());
  }();
  return best;
#else
  return GemmPath::Portable;
#endif
}

// "auto" runs AMX where it runs: measured on a 2-vCPU Intel Xeon with AMX (family 6, KVM), the bundled SmolLM2-135M
// in bf16, 2 threads, prefix 300 (tree_cost.py --paths amx,avx512bf16,avx512, one process, interleaved): one token
// 11.6 ms against 12.6 on avx512 and 11.5 on avx512bf16; trees of 3 / 9 / 17 nodes 13.7 / 17.0 / 22.8 ms against
// 14.5 / 20.3 / 29.8 (avx512) and 14.5 / 21.3 / 32.6 (avx512bf16).
// Without AMX, AVX512-BF16 is the default on AMD CPUs only. On a 2-vCPU AMD EPYC (Zen 5, family 26), same model and
// measurement, interleaved: trees of 3 / 5 / 9 / 17 nodes took 0.92 / 0.98 / 0.91 / 0.84x the avx512 path's time
// and one token 1.02x (a second run: 0.94 / 0.91 / 0.91 / 0.82x and 0.94x); bench_native.py --gemm --cold ran 5-64
// rows at 1.1-1.6x avx512's multiply-adds/s, 4 rows at 0.8-1.0x; the eval sets (python -m dart_core.bench, two runs
// a path) gave DART 141 tok/s against 136. On an Intel Emerald Rapids VM (model 207, no AMX) VDPBF16PS ran tree
// blocks (M >= 4) at 0.6-0.85x the float32 kernel's multiply-adds/s (one port there, FMAs on two) and whole verifies
// 0.93-1.06x avx512's time, so Intel CPUs without AMX keep the float32-activation path. Zen 4 (also AMD with
// AVX512-BF16) was not measured. The path is one per process: vanilla and every drafter run the same one.
GemmPath small_gemm_default_path_for(GemmPath best, bool amd) {
  return (best == GemmPath::Avx512Bf16 && !amd) ? GemmPath::Avx512 : best;
}

GemmPath small_gemm_default_path() {
#ifdef DART_X86
  static const bool amd = __builtin_cpu_is("amd");
#else
  const bool amd = false;
#endif
  return small_gemm_default_path_for(small_gemm_best_path(), amd);
}

GemmPath small_gemm_path() {
  const int f = forced_path.load(std::memory_order_relaxed);
  return f >= 0 ? static_cast<GemmPath>(f) : env_path();
}

const char* small_gemm_path_source() {
  if (forced_path.load(std::memory_order_relaxed) >= 0) return "set";
  return env_choice().named ? "DART_GEMM_PATH" : "default";
}

void small_gemm_release_path() { forced_path.store(-1, std::memory_order_relaxed); }

void small_gemm_set_path(GemmPath path) {
  if (static_cast<int>(path) > static_cast<int>(small_gemm_best_path()))
    throw std::invalid_argument(std::string("small_gemm: this CPU cannot run the ") + small_gemm_path_name(path) +
                                " path (best: " + small_gemm_path_name(small_gemm_best_path()) + ")");
  forced_path.store(static_cast<int>(path), std::memory_order_relaxed);
}

const char* small_gemm_path_name(GemmPath path) {
  switch (path) {
    case GemmPath::Amx: return "amx";
    case GemmPath::Avx512Bf16: return "avx512bf16";
    case GemmPath::Avx512: return "avx512";
    case GemmPath::Avx2: return "avx2";
    default: return "portable";
  }
}

bool small_gemm_path_from_name(const std::string& name, GemmPath* out) {
  for (GemmPath p : {GemmPath::Amx, GemmPath::Avx512Bf16, GemmPath::Avx512, GemmPath::Avx2, GemmPath::Portable})
    if (name == small_gemm_path_name(p)) {
      *out = p;
      return true;
    }
  return false;
}

void small_gemm_f32(const float* x, const float* w, float* y, int64_t M, int64_t N, int64_t K, int threads) {
  run(x, w, y, M, N, K, std::max(1, threads));
}
void small_gemm_bf16(const float* x, const uint16_t* w, float* y, int64_t M, int64_t N, int64_t K, int threads) {
  run(x, w, y, M, N, K, std::max(1, threads));
}

}  // namespace dart

namespace dart {
namespace {
#ifdef DART_X86
__attribute__((target("avx2"))) uint64_t stream_read_avx2(const char* p, int64_t bytes) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  int64_t i = 0;
  for (; i + 128 <= bytes; i += 128) {
    a = _mm256_xor_si256(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_xor_si256(b, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    c = _mm256_xor_si256(c, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    d = _mm256_xor_si256(d, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  a = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), a);
  uint64_t s = lanes[0] ^ lanes[1] ^ lanes[2] ^ lanes[3];
  for (; i < bytes; ++i) s += static_cast<unsigned char>(p[i]);
  return s;
}
#endif
uint64_t stream_read_plain(const char* p, int64_t bytes) {
  uint64_t s = 0;
  int64_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    s ^= v;
  }
  for (; i < bytes; ++i) s += static_cast<unsigned char>(p[i]);
  return s;
}
}  // namespace

uint64_t stream_read(const void* p, int64_t bytes, int threads) {
  // Chunks of 256 KiB claimed in order by the GEMM's thread pool, as the GEMM's rows are: each thread streams
  // whole chunks of consecutive bytes.
  threads = std::max(1, threads);
  const char* base = static_cast<const char*>(p);
  int64_t chunk = 256 << 10;
  while ((bytes + chunk - 1) / chunk > 4096) chunk *= 2;
  const int64_t chunks = (bytes + chunk - 1) / chunk;
  std::vector<uint64_t> sums(static_cast<size_t>(chunks), 0);
  parallel_for_items(threads, chunks, [&](int64_t i) {
    const int64_t a = i * chunk, b = std::min<int64_t>(bytes, a + chunk);
#ifdef DART_X86
    if (small_gemm_has_avx2()) { sums[i] = stream_read_avx2(base + a, b - a); return; }
#endif
    sums[i] = stream_read_plain(base + a, b - a);
  });
  uint64_t s = 0;
  for (uint64_t v : sums) s ^= v;
  return s;
}

}  // namespace dart
