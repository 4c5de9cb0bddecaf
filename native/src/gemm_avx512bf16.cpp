// The small GEMM's AVX512-BF16 kernel (bf16 weights): the activations rounded to bf16 once per call, VDPBF16PS
// against the weights as loaded (no widening); for M <= 2 weight rows one after the other, for M = 3-9 three or four
// weight rows side by side (each stream prefetched into L2 8 KiB ahead), 4 x 6 blocks above.
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

DART_AVX512BF16 inline __m512bh as_bh(__m512i v) { return (__m512bh)v; }
// 32 bf16 values from any address as the dot product's operand. Not as_bh(_mm512_loadu_si512(p)) with as_bh a
// reinterpret_cast through a reference (as it was): GCC 12 sent such values through the stack (a 64-byte store and
// reload in front of each VDPBF16PS but a step's first), which held the 3-4 row kernels to 0.4x the one-row kernel's
// in-cache rate.
DART_AVX512BF16 inline __m512bh load_bh(const uint16_t* p) { return (__m512bh)_mm512_loadu_epi16(p); }

// How far ahead of its loads a weight row's stream prefetches (bytes) and how: PREFETCHT1, which on AMD CPUs fills
// L2, not L1. Measured on a 2-vCPU Zen 4 EPYC (the decoder's matrices, 2 threads, 9-11 interleaved sweeps in one
// process): one row 7.3 ms against 7.9 without a prefetch and 8.6 with the rows two ahead in L1 (PREFETCHT0); with
// the rows one after the other (as M = 3-7 ran before 2026-12-05) 4 rows 8.7 against 10.4 ms, 5 rows 8.6-9.1
// against 11.0-12.8; 2 KiB ahead measured the same at one row and 1.2x slower at 4-5 rows.
constexpr int64_t kStreamAhead = 4096;
// The same for each of the streams of rows side by side (block_bf16dp): they compute less per byte than a row's
// chain, so they run further ahead. On the Zen 4 EPYC (the model's 269 MB, 2 threads, 10 interleaved sweeps a
// process, four processes in which the VM read 58-61 GB/s) 3 rows read 39-43 GB/s of weights at 8 KiB ahead against
// 35-36 at one group of rows ahead and 33-35 for the rows one after the other (one row 46-51); 5 rows 38-40 against
// 36-38. Where the VM read ~36 GB/s every choice ran at 31-36.
constexpr int64_t kSideAhead = 8192;

// R weight rows side by side (their k loops interleaved) x C activation rows from row m: R * C independent sums a
// step, so the VDPBF16PS latency (~6 cycles on Zen 4) is hidden once a step holds more products than one row's
// chain overlaps (M >= 3). R * C accumulators + R weight vectors + 1 activation vector registers: 4 x 7 needs 33 (one
// spills; in cache still 1.17x the rate of 3 x 7 plus a row). prefetch: each weight row's stream kSideAhead bytes on,
// into L2 (the first group of activation rows to meet the weight rows reads them from memory; later groups of a
// block find them in L1). The sums are the ones rows4_bf16dp / row1_bf16dp form, in the same order (same bits).
template <int R, int C>
DART_AVX512BF16 void block_bf16dp(const uint16_t* xb, int64_t ldb, const uint16_t* w, float* y, int64_t N,
                                  int64_t K, int64_t n, int64_t m, bool prefetch = false) {
  __m512 acc[R][C];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  const int64_t body = K - K % 32;
  const uint16_t* xr = xb + m * ldb;
  const uint16_t* wr = w + n * K;
  for (int64_t k = 0; k < body; k += 32) {
    if (prefetch)
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(wr + r * K + k) + kSideAhead, _MM_HINT_T1);
    __m512i wv[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) wv[r] = _mm512_loadu_si512(wr + r * K + k);
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) {
      const __m512bh xv = load_bh(xr + c * ldb + k);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, as_bh(wv[r]));
    }
  }
  if (body < K) {   // the K % 32 tail: one masked step, the same lanes for every row
    const __mmask32 mask = static_cast<__mmask32>((1ull << (K - body)) - 1ull);
    __m512i wv[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) wv[r] = _mm512_maskz_loadu_epi16(mask, wr + r * K + body);
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) {
      const __m512bh xv = load_bh(xr + c * ldb + body);   // zeros past K (packed)
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, as_bh(wv[r]));
    }
  }
  if constexpr (R % 4 == 0) {
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c)
#pragma GCC unroll 16
      for (int r = 0; r < R; r += 4)
        _mm_storeu_ps(y + (m + c) * N + n + r, hsum16x4(acc[r][c], acc[r + 1][c], acc[r + 2][c], acc[r + 3][c]));
  } else {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) y[(m + c) * N + n + r] = hsum16(acc[r][c]);
  }
}

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
      acc[c] = _mm512_dpbf16_ps(acc[c], load_bh(xb + c * ldb + k), as_bh(wv));
  }
  if (body < K) {
    const __m512i wv = _mm512_maskz_loadu_epi16(static_cast<__mmask32>((1ull << (K - body)) - 1ull), wr + body);
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c)
      acc[c] = _mm512_dpbf16_ps(acc[c], load_bh(xb + c * ldb + body), as_bh(wv));
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

// All M packed activation rows against weight rows [n0, n1): M <= 2 streams the weight rows one after the other, four
// at a time (rows4_bf16dp); M = 3-7 runs four weight rows side by side and M = 8-9 three, every activation row in one
// group (block_bf16dp; the rows a range leaves over one at a time, row1_bf16dp); M >= 10 runs 4 weight rows side by
// side against groups of 6 activation rows (the block stays in L1 while the groups pass).
DART_AVX512BF16 void rows_avx512bf16_t(const uint16_t* xb, int64_t ldb, const uint16_t* w, float* y, int64_t M,
                                     int64_t N, int64_t K, int64_t n0, int64_t n1, bool gemv_prefetch) {
  int64_t n = n0;
  if (M <= 2) {
    // A plain step: one sequential run of weights per thread, prefetched into L2 where the load-time measurement
    // keeps gemv_prefetch (in place on a Zen 4 EPYC both ran 2-3% faster without it). Measured there, 2 threads: at
    // M = 1 rows one by one took 6.8-7.1 ms against 8.1-8.4 ms for blocks of 8 rows (the decoder's weights). At M = 2
    // four rows side by side (as from M = 3) read 37.9 GB/s from memory against 46.0 where the VM read 59 GB/s (the
    // same, 29-35, where it read ~35), though 1.13x faster in cache: two products a step still overlap.
    for (; n + 4 <= n1; n += 4) {
      if (M == 1) rows4_bf16dp<1>(xb, ldb, w, y, N, K, n, gemv_prefetch);
      else rows4_bf16dp<2>(xb, ldb, w, y, N, K, n, gemv_prefetch);
    }
  } else if (M <= 7) {
    // A small tree. One row's chain of VDPBF16PS (K / 32 steps, each waiting ~6 cycles for the last) does not leave
    // the CPU enough independent work once a step holds 3+ products: on a Zen 4 EPYC (2 threads, 14 MB of
    // [1536, 576] matrices in cache, 15 interleaved sweeps) rows one after the other read 56 / 56 / 54 / 42 GB/s of
    // weights at M = 3 / 4 / 5 / 7, four side by side 94 / 85 / 72 / 53 (one row 110); from memory see kSideAhead.
    // Figures: docs/benchmarks.md (issue 39).
    for (; n + 4 <= n1; n += 4) {
      switch (M) {
        case 3: block_bf16dp<4, 3>(xb, ldb, w, y, N, K, n, 0, true); break;
        case 4: block_bf16dp<4, 4>(xb, ldb, w, y, N, K, n, 0, true); break;
        case 5: block_bf16dp<4, 5>(xb, ldb, w, y, N, K, n, 0, true); break;
        case 6: block_bf16dp<4, 6>(xb, ldb, w, y, N, K, n, 0, true); break;
        default: block_bf16dp<4, 7>(xb, ldb, w, y, N, K, n, 0, true); break;
      }
    }
  } else if (M <= 9) {
    // 8-9 rows: three weight rows side by side (in cache 34 / 30 GB/s against 28 / 26 for one row at a time; four
    // would not fit the registers), the rest of the range a row at a time. From 10 rows the blocks win, each
    // activation load there feeding four products.
    for (; n + 3 <= n1; n += 3) {
      if (M == 8) block_bf16dp<3, 8>(xb, ldb, w, y, N, K, n, 0, true);
      else block_bf16dp<3, 9>(xb, ldb, w, y, N, K, n, 0, true);
    }
    for (; n < n1; ++n) {
      if (M == 8) row1_bf16dp<8>(xb, ldb, w, y, N, K, n);
      else row1_bf16dp<9>(xb, ldb, w, y, N, K, n);
    }
  } else {
    // The first group of 6 activation rows streams each block of 4 weight rows from memory, prefetching each row's
    // stream kSideAhead bytes on; the other groups read the block from L1. On the Zen 4 EPYC (the model's 269 MB,
    // 2 threads, 10 interleaved sweeps a process, seven processes) 10 rows read 25-30 GB/s of weights against 23-26
    // with the next block's lines prefetched in address order, spread over the first one or two groups (as before
    // 2026-12-05); 12 rows 22-27 against 22-26, 17 rows the same (19-20, compute-bound). PREFETCHT1 (into L2 on AMD),
    // not T0: with the earlier scheme on a Zen 4 EPYC 17 rows took 0.76x the time and 10-12 rows 0.87-0.96x.
    for (; n + 4 <= n1; n += 4) {
      int64_t m = 0;
      for (; m + 6 <= M; m += 6) block_bf16dp<4, 6>(xb, ldb, w, y, N, K, n, m, m == 0);
      const bool first = m == 0;
      switch (M - m) {
        case 5: block_bf16dp<4, 5>(xb, ldb, w, y, N, K, n, m, first); break;
        case 4: block_bf16dp<4, 4>(xb, ldb, w, y, N, K, n, m, first); break;
        case 3: block_bf16dp<4, 3>(xb, ldb, w, y, N, K, n, m, first); break;
        case 2: block_bf16dp<4, 2>(xb, ldb, w, y, N, K, n, m, first); break;
        case 1: block_bf16dp<4, 1>(xb, ldb, w, y, N, K, n, m, first); break;
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
