// See small_gemm.hpp. A call packs the activations as its path needs them (bf16 rows for AVX512-BF16 and AMX, 64-byte
// aligned float32 rows for AVX-512), cuts the weight rows into chunks that a persistent thread pool claims in order
// (parallel_items, thread_pool.hpp) and runs the path's kernel on each chunk: one file per instruction-set family
// (gemm_kernels.hpp lists them, each file says how it blocks), the path chosen in gemm_path.cpp. Each weight element
// is loaded from memory once per call. The lane-wise partial sums are reduced in one fixed order at the end of every
// dot product, which makes the result independent of M and of the row blocking (within one path).
#include "small_gemm.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "gemm_kernels.hpp"
#include "thread_pool.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace dart {
namespace gemm {

std::atomic<bool> legacy_mode{false};
std::atomic<int64_t> many_rows{12};
std::atomic<int64_t> items_per_thread{0};

}  // namespace gemm

namespace {

using namespace gemm;

// Per path (indexed by GemmPath): whether the one-row kernel (the plain decoding step's GEMV) prefetches the next
// block of weight rows in software (small_gemm_set_gemv_prefetch). Only the speed depends on it, never a result.
std::atomic<bool> gemv_prefetch_on[5] = {true, true, true, true, true};

template <typename W>
void run(const float* x, const W* w, float* y, int64_t M, int64_t N, int64_t K, int threads) {
  // The weight rows are cut into chunks of consecutive rows (multiples of 8) that the threads claim in order
  // (parallel_items): each thread streams whole chunks, and a thread the OS has not scheduled yet (a busy machine)
  // leaves its chunks to the others instead of holding the call up. The chunks are about kChunkBytes of weights
  // each, at least 2 per thread, or `items_per_thread` equal ranges per thread (small_gemm_set_split: fewer, longer
  // streams, which a CPU's prefetchers may follow better). An output does not depend on which thread or chunk
  // computes it (the summation order is fixed by K).
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
    parallel_row_ranges(threads, 0, M, [&](int64_t r0, int64_t r1) {   // a prompt chunk's rows on both threads
      pack_bf16_rows(x + r0 * K, r1 - r0, K, ldb, base + r0 * ldb);
    });
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
  const int64_t per_thread = items_per_thread.load(std::memory_order_relaxed);
  int64_t chunk;
  if (per_thread > 0) {
    const int64_t ranges = threads * per_thread;
    chunk = std::max<int64_t>(unit, ((N + ranges - 1) / ranges + unit - 1) / unit * unit);
  } else {
    chunk = std::max<int64_t>(unit, (kChunkBytes / row_bytes + unit - 1) / unit * unit);
    chunk = std::min(chunk, std::max<int64_t>(unit, (N / (2 * threads) + unit - 1) / unit * unit));
  }
  while ((N + chunk - 1) / chunk > 4096) chunk *= 2;
  const int64_t chunks = (N + chunk - 1) / chunk;
  parallel_for_items(threads, chunks, [&](int64_t i) { rows(i * chunk, std::min(N, (i + 1) * chunk)); });
}

}  // namespace

void small_gemm_set_legacy(bool on) { legacy_mode.store(on, std::memory_order_relaxed); }

void small_gemm_set_split(int64_t items) {
  if (items < 0 || items > 64)
    throw std::invalid_argument("small_gemm_set_split: items per thread must be 0 (chunks of ~48 KiB) or 1-64");
  items_per_thread.store(items, std::memory_order_relaxed);
}
int64_t small_gemm_split() { return items_per_thread.load(std::memory_order_relaxed); }

void small_gemm_set_many_rows(int64_t rows) { many_rows.store(std::max<int64_t>(1, rows), std::memory_order_relaxed); }
int64_t small_gemm_many_rows() { return many_rows.load(std::memory_order_relaxed); }

void small_gemm_set_gemv_prefetch(GemmPath path, bool on) {
  gemv_prefetch_on[static_cast<int>(path)].store(on, std::memory_order_relaxed);
}
bool small_gemm_gemv_prefetch(GemmPath path) {
  return gemv_prefetch_on[static_cast<int>(path)].load(std::memory_order_relaxed);
}

void small_gemm_f32(const float* x, const float* w, float* y, int64_t M, int64_t N, int64_t K, int threads) {
  run(x, w, y, M, N, K, std::max(1, threads));
}
void small_gemm_bf16(const float* x, const uint16_t* w, float* y, int64_t M, int64_t N, int64_t K, int threads) {
  run(x, w, y, M, N, K, std::max(1, threads));
}

}  // namespace dart
