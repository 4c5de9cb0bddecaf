// The small GEMM's AMX-BF16 kernel (bf16 weights) and whether this process may run it. Only built for x86-64.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "gemm_kernels.hpp"

namespace dart {
namespace gemm {
namespace {

#ifdef DART_X86
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
DART_AMX void pack_amx_b_t(const uint16_t* xb, int64_t ldb, int64_t M, uint32_t* out) {
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

DART_AMX void rows_amx_t(const uint32_t* xv, int64_t ldb, const uint16_t* w, float* y, int64_t M, int64_t N, int64_t K,
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
#endif

}  // namespace

#ifdef DART_X86
void pack_amx_b(const uint16_t* xb, int64_t ldb, int64_t M, uint32_t* out) { pack_amx_b_t(xb, ldb, M, out); }
void rows_amx(const uint32_t* xv, int64_t ldb, const uint16_t* w, float* y, int64_t M, int64_t N, int64_t K,
              int64_t n0, int64_t n1) {
  rows_amx_t(xv, ldb, w, y, M, N, K, n0, n1);
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

}  // namespace gemm
}  // namespace dart
