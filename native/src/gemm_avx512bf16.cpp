// The small GEMM's AVX512-BF16 kernel (bf16 weights): the activations rounded to bf16 once per call, VDPBF16PS
// against the weights as loaded (no widening), weight rows one after the other for M <= 9 (prefetched into L2), 4 x 6
// blocks above.
// Only built for x86-64.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "gemm_kernels.hpp"
#include "gemm_avx512_simd.hpp"

namespace dart {
namespace gemm {
namespace {

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
DART_AVX512BF16 void pack_bf16_rows_t(const float* x, int64_t M, int64_t K, int64_t ldb, uint16_t* xb) {
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
      _mm_prefetch(prefetch + line * 64, _MM_HINT_T1);
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

// How far ahead of its loads a streaming kernel prefetches its weights (bytes) and how: PREFETCHT1, which on AMD
// CPUs fills L2, not L1. Measured on a 2-vCPU Zen 4 EPYC (the decoder's matrices, 2 threads, 9-11 interleaved
// sweeps in one process): one row 7.3 ms against 7.9 without a prefetch and 8.6 with the rows two ahead in L1 (the
// PREFETCHT0 this kernel used before); 4 rows 8.7 against 10.4, 5 rows 8.6-9.1 against 11.0-12.8, 7 rows 9.0-10.0
// against 13-15; 2 KiB ahead measured the same at one row and 1.2x slower at 4-5 rows.
constexpr int64_t kStreamAhead = 4096;

// One weight row (wr, K elements) into C lane sums against the C packed activation rows: the 32-wide steps of the
// body, then the K % 32 tail as one masked step (the activations are zero past K). prefetch: each step's weight line
// kStreamAhead bytes on, into L2 (a prefetch never faults, so one past the matrix's end is harmless).
template <int C>
DART_AVX512BF16 __attribute__((always_inline)) inline void row_sums_bf16dp(const uint16_t* xb, int64_t ldb,
                                                                           const uint16_t* wr, int64_t K,
                                                                           bool prefetch, __m512* acc) {
  const int64_t body = K - K % 32;
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t k = 0; k < body; k += 32) {
    if (prefetch) _mm_prefetch(reinterpret_cast<const char*>(wr + k) + kStreamAhead, _MM_HINT_T1);
    const __m512i wv = _mm512_loadu_si512(wr + k);
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c)
      acc[c] = _mm512_dpbf16_ps(acc[c], as_bh(_mm512_loadu_si512(xb + c * ldb + k)), as_bh(wv));
  }
  if (body < K) {
    const __m512i wv = _mm512_maskz_loadu_epi16(static_cast<__mmask32>((1ull << (K - body)) - 1ull), wr + body);
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c)
      acc[c] = _mm512_dpbf16_ps(acc[c], as_bh(_mm512_loadu_si512(xb + c * ldb + body)), as_bh(wv));
  }
}

// Four weight rows one after the other (each row's k loop ends before the next begins: one sequential run of
// weights), C activation rows against each, the four rows' sums reduced together (hsum16x4: the bits of hsum16).
// 4 * C + 2 <= 32 registers.
template <int C>
DART_AVX512BF16 void rows4_bf16dp(const uint16_t* xb, int64_t ldb, const uint16_t* w, float* y, int64_t N, int64_t K,
                                  int64_t n, bool prefetch) {
  __m512 acc[4][C];
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) row_sums_bf16dp<C>(xb, ldb, w + (n + r) * K, K, prefetch, acc[r]);
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) _mm_storeu_ps(y + c * N + n, hsum16x4(acc[0][c], acc[1][c], acc[2][c], acc[3][c]));
}

// One weight row against C activation rows (too many for four rows' sums to wait in registers), each sum reduced
// as its row ends (hsum16), the weights always prefetched. C + 2 <= 32 registers.
template <int C>
DART_AVX512BF16 void row1_bf16dp(const uint16_t* xb, int64_t ldb, const uint16_t* w, float* y, int64_t N, int64_t K,
                                 int64_t n) {
  __m512 acc[C];
  row_sums_bf16dp<C>(xb, ldb, w + n * K, K, true, acc);
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) y[c * N + n] = hsum16(acc[c]);
}

// All M packed activation rows against weight rows [n0, n1): M <= 7 streams the weight rows one after the other, four
// at a time (rows4_bf16dp), M = 8-9 one at a time (row1_bf16dp), M >= 10 runs 4 weight rows side by side against
// groups of 6 activation rows (the block stays in L1 while the groups pass).
DART_AVX512BF16 void rows_avx512bf16_t(const uint16_t* xb, int64_t ldb, const uint16_t* w, float* y, int64_t M,
                                     int64_t N, int64_t K, int64_t n0, int64_t n1, bool gemv_prefetch) {
  int64_t n = n0;
  if (M <= 7) {
    // A plain step or a small tree: one sequential run of weights per thread, prefetched into L2 (at M = 1-2 where
    // the load-time measurement keeps gemv_prefetch: in place on a Zen 4 EPYC both ran 2-3% faster without it, 3
    // rows 5% faster with it). Measured there, 2 threads: at M = 1 rows one by one took 6.8-7.1 ms against 8.1-8.4
    // ms for blocks of 8 rows (the decoder's weights); at M = 3-7 with the L2 prefetch 0.85-0.93x the time of the
    // 4 x C blocks prefetching alike, whose four weight streams the hardware follows less well. Figures:
    // docs/benchmarks.md (issue 39).
    for (; n + 4 <= n1; n += 4) {
      switch (M) {
        case 1: rows4_bf16dp<1>(xb, ldb, w, y, N, K, n, gemv_prefetch); break;
        case 2: rows4_bf16dp<2>(xb, ldb, w, y, N, K, n, gemv_prefetch); break;
        case 3: rows4_bf16dp<3>(xb, ldb, w, y, N, K, n, true); break;
        case 4: rows4_bf16dp<4>(xb, ldb, w, y, N, K, n, true); break;
        case 5: rows4_bf16dp<5>(xb, ldb, w, y, N, K, n, true); break;
        case 6: rows4_bf16dp<6>(xb, ldb, w, y, N, K, n, true); break;
        default: rows4_bf16dp<7>(xb, ldb, w, y, N, K, n, true); break;
      }
    }
  } else if (M <= 9) {
    // 8-9 rows: still one run of weights, a row at a time (measured 0.90-0.93x the time of the blocks; from 10 rows
    // the blocks win, each activation load there feeding four products against one here).
    for (; n < n1; ++n) {
      if (M == 8) row1_bf16dp<8>(xb, ldb, w, y, N, K, n);
      else row1_bf16dp<9>(xb, ldb, w, y, N, K, n);
    }
  } else {
    const int64_t block_lines = (4 * K * 2 + 63) / 64;
    // The next block's prefetches go out during the first group of 6 activation rows; with exactly two groups
    // (M = 10-12 here) half during each. Measured on a Zen 5 EPYC sweeping the decoder's weights, 120 interleaved pairs,
    // three runs: M = 9 0.94-0.96x, 10 0.96-0.98x, 7-8 and 11-12 0.98-1.01x; spread over three groups (M = 13-17) it
    // measured 1.02-1.06x, so those keep them in the first. PREFETCHT1 (into L2 on AMD), not T0: on a Zen 4 EPYC
    // 17 rows took 0.76x the time and 10-12 rows 0.87-0.96x (the same sweeps as the row kernels' figures above).
    const int64_t split = M <= 12 ? block_lines / 2 : block_lines;
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

#endif

}  // namespace

#ifdef DART_X86
void pack_bf16_rows(const float* x, int64_t M, int64_t K, int64_t ldb, uint16_t* xb) {
  pack_bf16_rows_t(x, M, K, ldb, xb);
}
void rows_avx512bf16(const uint16_t* xb, int64_t ldb, const uint16_t* w, float* y, int64_t M, int64_t N, int64_t K,
                     int64_t n0, int64_t n1, bool gemv_prefetch) {
  rows_avx512bf16_t(xb, ldb, w, y, M, N, K, n0, n1, gemv_prefetch);
}
#endif

}  // namespace gemm
}  // namespace dart
