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

namespace dart {

// True when this CPU runs the AVX2+FMA kernels (otherwise a portable loop runs).
bool small_gemm_has_avx2();

// y = x @ w^T for row-major x [M, K], w [N, K] and y [M, N]; threads > 0. M = 0 or N = 0
// writes nothing; K = 0 gives zeros.
void small_gemm_f32(const float* x, const float* w, float* y, int64_t M, int64_t N, int64_t K, int threads);
void small_gemm_bf16(const float* x, const uint16_t* w, float* y, int64_t M, int64_t N, int64_t K, int threads);

}  // namespace dart
