// The small GEMM's kernels, one file per instruction-set family (gemm_portable_avx2.cpp, gemm_avx512.cpp,
// gemm_avx512bf16.cpp, gemm_amx.cpp), as small_gemm.cpp's run() calls them: rows [n0, n1) of y = x @ w^T for all M
// activation rows. Internal to the small GEMM; small_gemm.hpp is the interface. The kernels are compiled per function
// with target attributes; these entry points carry none, so any file may call them (small_gemm.cpp calls only what
// small_gemm_path() allows on this CPU).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#include <immintrin.h>
#define DART_X86 1
#endif

namespace dart {
namespace gemm {

// Benchmarks only (small_gemm_set_legacy): run the kernels as before the thread pool (an OpenMP region per call,
// equal contiguous ranges) and one row with 256-bit blocks on every CPU, for before/after arms in one process.
extern std::atomic<bool> legacy_mode;
// The row count from which the AVX-512 and AVX2 kernels widen a call's bf16 weights once for all rows
// (rows_avx512_many, rows_avx2_many); small_gemm_set_many_rows moves it (benchmarks).
extern std::atomic<int64_t> many_rows;
// Weight rows the many-rows kernels widen per pass: about 96 KiB of float32, a multiple of 4 (a thread's range may
// be every row of a single-threaded call).
inline int64_t many_rows_pass(int64_t K) {
  return std::max<int64_t>(4, (96 << 10) / std::max<int64_t>(1, K * 4) / 4 * 4);
}

inline float bf16_to_f32(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// gemm_portable_avx2.cpp: plain loops in the AVX2 kernel's summation order, and the AVX2 kernel.
void rows_portable(const float* x, const float* w, float* y, int64_t M, int64_t N, int64_t K, int64_t n0, int64_t n1);
void rows_portable(const float* x, const uint16_t* w, float* y, int64_t M, int64_t N, int64_t K, int64_t n0,
                   int64_t n1);
#ifdef DART_X86
void rows_avx2(const float* x, const float* w, float* y, int64_t M, int64_t N, int64_t K, int64_t n0, int64_t n1,
               bool gemv_prefetch);
void rows_avx2(const float* x, const uint16_t* w, float* y, int64_t M, int64_t N, int64_t K, int64_t n0, int64_t n1,
               bool gemv_prefetch);
// gemm_avx512.cpp: float32 activations, 16 lanes; x rows ldx floats apart (64-byte aligned for M >= 2).
void rows_avx512(const float* x, int64_t ldx, const float* w, float* y, int64_t M, int64_t N, int64_t K, int64_t n0,
                 int64_t n1, bool gemv_prefetch);
void rows_avx512(const float* x, int64_t ldx, const uint16_t* w, float* y, int64_t M, int64_t N, int64_t K,
                 int64_t n0, int64_t n1, bool gemv_prefetch);
// gemm_avx512bf16.cpp: x [M, K] float32 -> xb [M, ldb] bf16 bit patterns (ldb = K rounded up to 32, zeros past K),
// then VDPBF16PS against bf16 weights.
void pack_bf16_rows(const float* x, int64_t M, int64_t K, int64_t ldb, uint16_t* xb);
void rows_avx512bf16(const uint16_t* xb, int64_t ldb, const uint16_t* w, float* y, int64_t M, int64_t N, int64_t K,
                     int64_t n0, int64_t n1, bool gemv_prefetch);
// gemm_amx.cpp: the packed bf16 rows laid out as B tiles, then TDPBF16PS; amx_available: the CPU has AMX-BF16 and
// the OS granted this process the tiles.
void pack_amx_b(const uint16_t* xb, int64_t ldb, int64_t M, uint32_t* out);
void rows_amx(const uint32_t* xv, int64_t ldb, const uint16_t* w, float* y, int64_t M, int64_t N, int64_t K,
              int64_t n0, int64_t n1);
bool amx_available();
#endif

}  // namespace gemm
}  // namespace dart
