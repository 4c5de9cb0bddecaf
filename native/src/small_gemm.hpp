// Small-M matrix products for decoding on CPUs: y[M, N] = x[M, K] @ w[N, K]^T.
//
// A decoding step multiplies a handful of rows (1 for a plain step, a few dozen for a
// draft tree) by every weight matrix of the model, so the step is bound by reading the
// weights once. BLAS libraries treat M = 2..32 as a small GEMM and pay 2-3x the M = 1
// cost on CPUs without AMX; here every weight row is read once and multiplied into all
// M activation rows while it sits in L1, so a tree costs little more than one token.
//
// Weights are float32 or bfloat16 (raw uint16 bit patterns, converted exactly by a
// 16-bit shift); activations and accumulation are float32. Each output is one dot
// product summed in a fixed order that does not depend on M, so a row of a tree
// verification is bit-identical to the same row computed alone.
#pragma once

#include <cstdint>
#include <string>

namespace dart {

// True when this CPU has AVX2+FMA (the AVX2 kernel, and the decoder's AVX2 helpers, can run).
bool small_gemm_has_avx2();

// The kernel a call runs, chosen at run time (the extension is built for any x86-64 or other
// CPU; the vector kernels are compiled per function with target attributes):
//   Avx512   AVX-512F/BW/VL: 16 float lanes, 4 weight rows x 6 activation rows per block
//            (M <= 3: 256-bit operations in the same 16-lane order, faster when streaming weights);
//   Avx2     AVX2+FMA: 8 lanes, 4 x 3 blocks (8 x 1 for one row);
//   Portable plain C++ with the AVX2 path's summation order (the two agree bit for bit).
// Within one path every output is summed in a fixed order that depends only on K, never on M,
// on the other rows of the call or on the blocking, so a row of a tree verification is
// bit-identical to the same row computed alone. Different paths may round differently
// (16-lane vs 8-lane partial sums): that is fine because vanilla decoding and speculative
// verification in one process always run the same path.
//   Avx512Bf16  AVX512-BF16 (Zen 4, Sapphire Rapids and later): for bf16 weights the activations are rounded to
//            bf16 (nearest even) once per call and multiplied by VDPBF16PS (exact bf16 products, float32 sums,
//            16 lanes of 32-element steps, the K % 32 tail masked), so its results differ from the float32-activation
//            paths by the activations' rounding; float32 weights run the Avx512 kernel (the same bits). Rows are
//            independent as on every path.
//   Amx      AMX-BF16 (Sapphire Rapids and later, where the OS grants the tile registers): the activations rounded
//            to bf16 as on Avx512Bf16, multiplied by TDPBF16PS, 16 weight rows x 32 k per tile against up to 16
//            activation rows, one float32 sum per output over the 32-wide k blocks in order; float32 weights run the
//            Avx512 kernel. Rows are independent; the sums differ from Avx512Bf16's (another order).
enum class GemmPath : int { Portable = 0, Avx2 = 1, Avx512 = 2, Avx512Bf16 = 3, Amx = 4 };

// The best path this CPU supports (the paths are ordered: each runs where the ones below it do).
GemmPath small_gemm_best_path();
// The best path for a CPU with these features (AVX2+FMA; AVX-512F/BW/VL; AVX512-BF16; AMX-BF16 with the tiles granted):
// what small_gemm_best_path computes from this CPU's, as a pure function for tests.
GemmPath small_gemm_best_path_for(bool avx2, bool avx512, bool avx512bf16, bool amx);
// The path "auto" (and no DART_GEMM_PATH) runs: the best one (AMX where it runs), except that AVX512-BF16 runs by
// default on AMD CPUs only (elsewhere Avx512; measured: see small_gemm.cpp).
GemmPath small_gemm_default_path();
// The default path for a CPU whose best path is `best`, by vendor: a pure function for tests.
GemmPath small_gemm_default_path_for(GemmPath best, bool amd);
// The path calls run now: the default one, unless DART_GEMM_PATH (read once, at the first call:
// "amx" | "avx512bf16" | "avx512" | "avx2" | "portable" | "auto") or small_gemm_set_path chose another. A request for a
// path the CPU lacks runs the best path below it; an unknown name is ignored (a warning on stderr).
GemmPath small_gemm_path();
// Who chose the path calls run now: "set" (small_gemm_set_path), "DART_GEMM_PATH" (the variable names a path) or
// "default" (neither: small_gemm_default_path, which a caller measuring the paths may replace).
const char* small_gemm_path_source();
// Forces a path for all later calls (tests, benchmarks); throws std::invalid_argument when this
// CPU cannot run it. Not meant to be changed while another thread is inside a call.
void small_gemm_set_path(GemmPath path);
// Drops a path small_gemm_set_path forced: calls run DART_GEMM_PATH's or the default again.
void small_gemm_release_path();
const char* small_gemm_path_name(GemmPath path);
// The path of that name ('amx', 'avx512bf16', 'avx512', 'avx2', 'portable') into *out; false for any other name.
bool small_gemm_path_from_name(const std::string& name, GemmPath* out);

// y = x @ w^T for row-major x [M, K], w [N, K] and y [M, N]; threads > 0. M = 0 or N = 0
// writes nothing; K = 0 gives zeros.
void small_gemm_f32(const float* x, const float* w, float* y, int64_t M, int64_t N, int64_t K, int threads);
void small_gemm_bf16(const float* x, const uint16_t* w, float* y, int64_t M, int64_t N, int64_t K, int threads);

// Benchmarks only (tree_cost.py --bandwidth --before): true runs the GEMM calls as before the thread pool (an OpenMP
// region per call, equal contiguous ranges; one row with 256-bit blocks on every CPU). Same results either way.
void small_gemm_set_legacy(bool on);

// The AVX-512 path's row count from which a call widens each bf16 weight block once for all its activation rows
// (default 12; see rows_avx512_many in small_gemm.cpp). Benchmarks only (tree_cost.py --prefill --many-rows): the
// same results at any value.
void small_gemm_set_many_rows(int64_t rows);
int64_t small_gemm_many_rows();

// How a call's weight rows are cut among the threads: 0 (the default) in chunks of about 48 KiB of weights, at
// least two per thread, claimed in order; k > 0 in k equal ranges per thread (1 or 2: one or two long streams a
// thread). Which streams faster depends on the CPU: on a Zen 4 EPYC (2 threads, the bundled model) one range a
// thread verified 9-row trees 0.9x the time and a plain step 0.97x; dart_core/models/gemm_split.py times the
// settings on the model's weights. Only the speed depends on it, never a result. Throws std::invalid_argument
// outside 0-64. Not meant to be changed while another thread is inside a call.
void small_gemm_set_split(int64_t items);
int64_t small_gemm_split();

// Whether the one-row kernel of `path` (M = 1: the plain decoding step's GEMV; on the avx512bf16 path also M = 2,
// which behaved alike) prefetches weights in software (default true). Only the speed depends on it, never a result.
// Which is faster differs by CPU and path: on a Zen 5 EPYC the avx512bf16 kernel streamed 88-93% of the read
// bandwidth without and 81-83% with it, while the avx512 and avx2 kernels lost 12-20 points without it;
// dart_core/models/gemv_prefetch.py measures both where the model runs. Not meant to be changed while another
// thread is inside a call.
void small_gemm_set_gemv_prefetch(GemmPath path, bool on);
bool small_gemm_gemv_prefetch(GemmPath path);

}  // namespace dart
