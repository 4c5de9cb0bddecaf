// See decoder.hpp. The arithmetic follows the HF modules it replaces (RMSNorm as
// w * (x * rsqrt(mean(x^2) + eps)), RoPE as x * cos + rotate_half(x) * sin, softmax with the
// row maximum subtracted); sums run in a different order, so results agree to float32
// rounding, not bit for bit.
#include "decoder.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>

#include "small_gemm.hpp"
#include "thread_pool.hpp"
#include "vector_math.hpp"   // DART_X86, exp8, which helpers the path runs

namespace dart {
namespace {

// y [M, N] += bias [N] (nothing when bias is null).
void add_bias(float* y, const float* bias, int64_t M, int64_t N) {
  if (bias)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) y[m * N + n] += bias[n];
}

void project(const DecoderShape& s, const float* x, const void* w, const float* bias, float* y, int64_t M,
             int64_t N, int64_t K, int threads) {
  if (s.bf16_weights)
    small_gemm_bf16(x, static_cast<const uint16_t*>(w), y, M, N, K, threads);
  else
    small_gemm_f32(x, static_cast<const float*>(w), y, M, N, K, threads);
  add_bias(y, bias, M, N);
}

// out[r] = weight * (x[r] * rsqrt(mean(x[r]^2) + eps)) for rows of length n; out may be x. Each row's sum of
// squares runs in order in double (the products are exact), one add waiting for the last: a row alone is a chain
// of n dependent adds (~0.5 us at n = 576 on a Zen 4 EPYC), so rows go four at a time, their chains interleaved.
// A row's sum is the same sequence of adds either way: the same bits whatever the row count.
void rms_norm(const float* x, const float* weight, float* out, int64_t rows, int64_t n, float eps) {
  auto finish = [&](int64_t r, double ss) {
    const float* xr = x + r * n;
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + eps);
    float* o = out + r * n;
    for (int64_t i = 0; i < n; ++i) o[i] = weight[i] * (xr[i] * inv);
  };
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    const float *x0 = x + r * n, *x1 = x0 + n, *x2 = x1 + n, *x3 = x2 + n;
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      s0 += static_cast<double>(x0[i]) * x0[i];
      s1 += static_cast<double>(x1[i]) * x1[i];
      s2 += static_cast<double>(x2[i]) * x2[i];
      s3 += static_cast<double>(x3[i]) * x3[i];
    }
    finish(r, s0);   // every sum is taken before a row is written (out may be x)
    finish(r + 1, s1);
    finish(r + 2, s2);
    finish(r + 3, s3);
  }
  for (; r < rows; ++r) {
    const float* xr = x + r * n;
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    finish(r, ss);
  }
}

// x [q, heads, D] rotated in place: x * cos + rotate_half(x) * sin, rotate_half = (-x2, x1).
// D is even (the binding refuses odd head_dims): the two halves cover every element.
void rope(float* x, int64_t q, int64_t heads, int64_t D, const float* cos, const float* sin) {
  const int64_t half = D / 2;
  for (int64_t i = 0; i < q; ++i) {
    const float* c = cos + i * D;
    const float* sn = sin + i * D;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (i * heads + h) * D;
      for (int64_t d = 0; d < half; ++d) {
        const float x1 = v[d], x2 = v[d + half];
        v[d] = x1 * c[d] - x2 * sn[d];
        v[d + half] = x2 * c[d + half] + x1 * sn[d + half];
      }
    }
  }
}

#ifdef DART_X86
// g[i] = silu(g[i]) * u[i] = g / (1 + exp(-g)) * u.
__attribute__((target("avx2,fma"))) void silu_mul_avx2(float* g, const float* u, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(g + i);
    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), v));
    _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(v, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
  }
  for (; i < n; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

// The same on 16 lanes (exp16 is exp8's steps per lane), the last 8 of a multiple of 8 and the scalar tail as
// silu_mul_avx2 takes them: every element the same bits. Half the instructions of the AVX2 loop: a prompt chunk's
// SiLU was 1.5% of its prefill.
__attribute__((target("avx512f,avx2,fma"))) void silu_mul_avx512(float* g, const float* u, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(g + i);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), v));
    _mm512_storeu_ps(g + i, _mm512_mul_ps(_mm512_div_ps(v, _mm512_add_ps(one, e)), _mm512_loadu_ps(u + i)));
  }
  silu_mul_avx2(g + i, u + i, n - i);
}
#endif

void silu_mul(float* g, const float* u, int64_t n) {
#ifdef DART_X86
  if (avx512_helpers()) return silu_mul_avx512(g, u, n);
  if (avx2_helpers()) return silu_mul_avx2(g, u, n);
#endif
  for (int64_t i = 0; i < n; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

}  // namespace

// The layer pieces the draft heads reuse (head_step.cpp), forwarding to the ones above (attention: attention.cpp).
namespace ops {
void project(const DecoderShape& s, const float* x, const void* w, const float* bias, float* y, int64_t M, int64_t N,
             int64_t K, int threads) {
  dart::project(s, x, w, bias, y, M, N, K, threads);
}
void rms_norm(const float* x, const float* weight, float* out, int64_t rows, int64_t n, float eps) {
  dart::rms_norm(x, weight, out, rows, n, eps);
}
void rope(float* x, int64_t q, int64_t heads, int64_t D, const float* cos, const float* sin) {
  dart::rope(x, q, heads, D, cos, sin);
}
void silu_mul(float* g, const float* u, int64_t n) { dart::silu_mul(g, u, n); }
}  // namespace ops

void fused_projections(const DecoderShape& s, LayerWeights* w, int64_t elem) {
  const int64_t qd = s.heads * s.head_dim, kvd = s.kv_heads * s.head_dim;
  const auto at = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
  // Each call has a fixed cost on every thread (its hand-off and the barrier after it): one call instead of three
  // (two) saves 90 of a step's 240 on a 30-layer model. Every output is still the same dot product over K.
  w->qkv_adjacent = at(w->k) == at(w->q) + static_cast<uintptr_t>(qd * s.hidden * elem) &&
                    at(w->v) == at(w->k) + static_cast<uintptr_t>(kvd * s.hidden * elem);
  w->gate_up_adjacent = at(w->up) == at(w->gate) + static_cast<uintptr_t>(s.intermediate * s.hidden * elem);
}

namespace {

// A call's activations, kept per calling thread between calls: a prompt chunk's (256 rows, ~9 MB) would otherwise
// be allocated, zeroed and faulted in again by every call. Grown, never shrunk; every element a layer reads it
// wrote first.
struct Scratch {
  std::vector<float> x, qs, ks, vs, attn, tmp, gate, up, fused;
};

float* grown(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

}  // namespace

void decoder_layers(const DecoderShape& s, const std::vector<LayerWeights>& layers,
                    const std::vector<LayerCache>& caches, int64_t capacity, int64_t begin, int64_t end, float* h,
                    int64_t q, const float* cos, const float* sin, const uint8_t* allowed, int64_t start,
                    int threads, int64_t tail_from) {
  if (begin < 0 || end > static_cast<int64_t>(layers.size()) || begin > end || caches.size() != layers.size())
    throw std::invalid_argument("decoder_layers: layer range or cache count does not match the model");
  if (q < 0 || start < 0 || start > capacity || q > capacity - start)   // no start + q: it can wrap
    throw std::invalid_argument("decoder_layers: positions outside the cache");
  if (tail_from < 0 || tail_from > q) throw std::invalid_argument("decoder_layers: tail_from outside 0..q");
  if (q == 0 || begin == end) return;   // nothing to run (an empty prompt chunk)
  if (s.head_dim % 2 != 0) throw std::invalid_argument("decoder_layers: RoPE needs an even head_dim");
  const int64_t H = s.heads, KV = s.kv_heads, D = s.head_dim, hid = s.hidden, I = s.intermediate;
  const int64_t qd = H * D, kvd = KV * D, qkv_n = qd + 2 * kvd;
  thread_local Scratch scratch;
  float* const x = grown(scratch.x, q * hid);
  float* const qs = grown(scratch.qs, q * qd);
  float* const ks = grown(scratch.ks, q * kvd);
  float* const vs = grown(scratch.vs, q * kvd);
  float* const attn = grown(scratch.attn, q * qd);
  float* const tmp = grown(scratch.tmp, q * hid);
  float* const gate = grown(scratch.gate, q * I);
  float* const up = grown(scratch.up, q * I);
  float* const fused = grown(scratch.fused, q * std::max(qkv_n, 2 * I));
  // Per row (parallel_row_ranges: from 32 rows on the pool's threads; the per-row work between the GEMMs was a tenth
  // of a prompt's prefill on one thread while the other waited).
  parallel_row_ranges(threads, 0, q, [&](int64_t r0, int64_t r1) {
    rms_norm(h + r0 * hid, layers[begin].in_norm, x + r0 * hid, r1 - r0, hid, s.eps);
  });
  for (int64_t l = begin; l < end; ++l) {
    const LayerWeights& w = layers[l];
    const LayerCache& c = caches[l];
    if (w.qkv_adjacent) {   // one call for q, k and v; each row's three parts copied out, biases added after
      project(s, x, w.q, nullptr, fused, q, qkv_n, hid, threads);
    } else {
      project(s, x, w.q, w.q_bias, qs, q, qd, hid, threads);
      project(s, x, w.k, w.k_bias, ks, q, kvd, hid, threads);
      project(s, x, w.v, w.v_bias, vs, q, kvd, hid, threads);
    }
    // Per row: its q, k, v (and biases), Qwen3's per-head norms, RoPE, and its K/V into the cache.
    parallel_row_ranges(threads, 0, q, [&](int64_t r0, int64_t r1) {
      const int64_t rows = r1 - r0;
      float *qr = qs + r0 * qd, *kr = ks + r0 * kvd, *vr = vs + r0 * kvd;
      if (w.qkv_adjacent) {
        for (int64_t i = r0; i < r1; ++i) {
          const float* row = fused + i * qkv_n;
          std::copy_n(row, qd, qs + i * qd);
          std::copy_n(row + qd, kvd, ks + i * kvd);
          std::copy_n(row + qd + kvd, kvd, vs + i * kvd);
        }
        add_bias(qr, w.q_bias, rows, qd);
        add_bias(kr, w.k_bias, rows, kvd);
        add_bias(vr, w.v_bias, rows, kvd);
      }
      if (w.q_norm) rms_norm(qr, w.q_norm, qr, rows * H, D, s.eps);
      if (w.k_norm) rms_norm(kr, w.k_norm, kr, rows * KV, D, s.eps);
      rope(qr, rows, H, D, cos + r0 * D, sin + r0 * D);
      rope(kr, rows, KV, D, cos + r0 * D, sin + r0 * D);
      for (int64_t i = r0; i < r1; ++i)
        for (int64_t kvh = 0; kvh < KV; ++kvh) {
          const size_t slot = static_cast<size_t>((kvh * capacity + start + i) * D);
          std::copy_n(ks + (i * KV + kvh) * D, D, c.keys + slot);
          std::copy_n(vs + (i * KV + kvh) * D, D, c.values + slot);
        }
    });
    // The last layer's rows past their K/V: from tail_from there (the rows a caller reads), every row elsewhere.
    const int64_t t = l == end - 1 ? tail_from : 0, n = q - t;
    if (n == 0) break;
    ops::attention(s, qs + t * qd, c, capacity, attn + t * qd, n, start + t, allowed ? allowed + t * (start + q) : nullptr,
                   threads);
    project(s, attn + t * qd, w.o, nullptr, tmp + t * hid, n, hid, H * D, threads);
    parallel_row_ranges(threads, t, q, [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0 * hid; i < r1 * hid; ++i) h[i] += tmp[i];
      rms_norm(h + r0 * hid, w.post_norm, x + r0 * hid, r1 - r0, hid, s.eps);
    });
    if (w.gate_up_adjacent) {   // one call for gate and up: row i holds its gate then its up
      project(s, x + t * hid, w.gate, nullptr, fused + t * 2 * I, n, 2 * I, hid, threads);
    } else {
      project(s, x + t * hid, w.gate, nullptr, gate + t * I, n, I, hid, threads);
      project(s, x + t * hid, w.up, nullptr, up + t * I, n, I, hid, threads);
    }
    // row by row: a row's tail (I not a multiple of the vector) runs as in a one-row step, whatever q is
    parallel_row_ranges(threads, t, q, [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0; i < r1; ++i) {
        if (w.gate_up_adjacent) {
          float* row = fused + i * 2 * I;
          silu_mul(row, row + I, I);
          std::copy_n(row, I, gate + i * I);
        } else {
          silu_mul(gate + i * I, up + i * I, I);
        }
      }
    });
    project(s, gate + t * I, w.down, nullptr, tmp + t * hid, n, hid, I, threads);
    // The residual, and with it the next layer's input norm (one pass over the rows for both).
    const float* next_norm = l + 1 < end ? layers[l + 1].in_norm : nullptr;
    parallel_row_ranges(threads, t, q, [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0 * hid; i < r1 * hid; ++i) h[i] += tmp[i];
      if (next_norm) rms_norm(h + r0 * hid, next_norm, x + r0 * hid, r1 - r0, hid, s.eps);
    });
  }
}

}  // namespace dart
