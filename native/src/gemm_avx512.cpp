// The small GEMM's AVX-512 kernel (F + BW + VL; float32 activations): a block of 4 weight rows is widened to float32
// 16 lanes at a time (bf16: one zero-extend + shift per 16 elements) and multiplied into groups of 6 activation rows
// (24 zmm accumulators + 4 weight vectors + 1 activation vector of the 32 registers); the 4 outputs of an activation
// row are reduced together (hsum16x4). M <= 3 (a decoding step, the smallest trees: memory-bound) runs 4 weight rows
// with 256-bit operations in the same 16-lane order. Only built for x86-64.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "gemm_kernels.hpp"
#include "gemm_avx2_simd.hpp"
#include "gemm_avx512_simd.hpp"

namespace dart {
namespace gemm {
namespace {

#ifdef DART_X86

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
DART_AVX512 void rows_avx512_t(const float* x, int64_t ldx, const W* w, float* y, int64_t M, int64_t N, int64_t K,
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

}  // namespace

#ifdef DART_X86
void rows_avx512(const float* x, int64_t ldx, const float* w, float* y, int64_t M, int64_t N, int64_t K, int64_t n0,
                 int64_t n1, bool gemv_prefetch) {
  rows_avx512_t(x, ldx, w, y, M, N, K, n0, n1, gemv_prefetch);
}
void rows_avx512(const float* x, int64_t ldx, const uint16_t* w, float* y, int64_t M, int64_t N, int64_t K,
                 int64_t n0, int64_t n1, bool gemv_prefetch) {
  rows_avx512_t(x, ldx, w, y, M, N, K, n0, n1, gemv_prefetch);
}
#endif

}  // namespace gemm
}  // namespace dart
