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

// out[r] = weight * (x[r] * rsqrt(mean(x[r]^2) + eps)) for rows of length n.
void rms_norm(const float* x, const float* weight, float* out, int64_t rows, int64_t n, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + eps);
    float* o = out + r * n;
    for (int64_t i = 0; i < n; ++i) o[i] = weight[i] * (xr[i] * inv);
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
#endif

void silu_mul(float* g, const float* u, int64_t n) {
#ifdef DART_X86
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

void decoder_layers(const DecoderShape& s, const std::vector<LayerWeights>& layers,
                    const std::vector<LayerCache>& caches, int64_t capacity, int64_t begin, int64_t end, float* h,
                    int64_t q, const float* cos, const float* sin, const uint8_t* allowed, int64_t start,
                    int threads) {
  if (begin < 0 || end > static_cast<int64_t>(layers.size()) || begin > end || caches.size() != layers.size())
    throw std::invalid_argument("decoder_layers: layer range or cache count does not match the model");
  if (q < 0 || start < 0 || start > capacity || q > capacity - start)   // no start + q: it can wrap
    throw std::invalid_argument("decoder_layers: positions outside the cache");
  if (q == 0 || begin == end) return;   // nothing to run (an empty prompt chunk)
  if (s.head_dim % 2 != 0) throw std::invalid_argument("decoder_layers: RoPE needs an even head_dim");
  const int64_t H = s.heads, KV = s.kv_heads, D = s.head_dim, hid = s.hidden, I = s.intermediate;
  const int64_t qd = H * D, kvd = KV * D, qkv_n = qd + 2 * kvd;
  std::vector<float> x(q * hid), qs(q * qd), ks(q * kvd), vs(q * kvd), attn(q * qd), tmp(q * hid), gate(q * I),
      up(q * I), fused(q * std::max(qkv_n, 2 * I));
  for (int64_t l = begin; l < end; ++l) {
    const LayerWeights& w = layers[l];
    const LayerCache& c = caches[l];
    rms_norm(h, w.in_norm, x.data(), q, hid, s.eps);
    if (w.qkv_adjacent) {   // one call for q, k and v; each row's three parts copied out, biases added after
      project(s, x.data(), w.q, nullptr, fused.data(), q, qkv_n, hid, threads);
      for (int64_t i = 0; i < q; ++i) {
        const float* row = fused.data() + i * qkv_n;
        std::copy_n(row, qd, qs.data() + i * qd);
        std::copy_n(row + qd, kvd, ks.data() + i * kvd);
        std::copy_n(row + qd + kvd, kvd, vs.data() + i * kvd);
      }
      add_bias(qs.data(), w.q_bias, q, qd);
      add_bias(ks.data(), w.k_bias, q, kvd);
      add_bias(vs.data(), w.v_bias, q, kvd);
    } else {
      project(s, x.data(), w.q, w.q_bias, qs.data(), q, qd, hid, threads);
      project(s, x.data(), w.k, w.k_bias, ks.data(), q, kvd, hid, threads);
      project(s, x.data(), w.v, w.v_bias, vs.data(), q, kvd, hid, threads);
    }
    if (w.q_norm) rms_norm(qs.data(), w.q_norm, qs.data(), q * H, D, s.eps);
    if (w.k_norm) rms_norm(ks.data(), w.k_norm, ks.data(), q * KV, D, s.eps);
    rope(qs.data(), q, H, D, cos, sin);
    rope(ks.data(), q, KV, D, cos, sin);
    for (int64_t i = 0; i < q; ++i)
      for (int64_t kvh = 0; kvh < KV; ++kvh) {
        const size_t slot = static_cast<size_t>((kvh * capacity + start + i) * D);
        std::copy_n(ks.data() + (i * KV + kvh) * D, D, c.keys + slot);
        std::copy_n(vs.data() + (i * KV + kvh) * D, D, c.values + slot);
      }
    ops::attention(s, qs.data(), c, capacity, attn.data(), q, start, allowed, threads);
    project(s, attn.data(), w.o, nullptr, tmp.data(), q, hid, H * D, threads);
    for (int64_t i = 0; i < q * hid; ++i) h[i] += tmp[i];
    rms_norm(h, w.post_norm, x.data(), q, hid, s.eps);
    if (w.gate_up_adjacent) {   // one call for gate and up: row i holds its gate then its up
      project(s, x.data(), w.gate, nullptr, fused.data(), q, 2 * I, hid, threads);
      for (int64_t i = 0; i < q; ++i) {
        float* row = fused.data() + i * 2 * I;
        silu_mul(row, row + I, I);
        std::copy_n(row, I, gate.data() + i * I);
      }
    } else {
      project(s, x.data(), w.gate, nullptr, gate.data(), q, I, hid, threads);
      project(s, x.data(), w.up, nullptr, up.data(), q, I, hid, threads);
      // row by row: a row's tail (I not a multiple of the vector) runs as in a one-row step, whatever q is
      for (int64_t i = 0; i < q; ++i) silu_mul(gate.data() + i * I, up.data() + i * I, I);
    }
    project(s, gate.data(), w.down, nullptr, tmp.data(), q, hid, I, threads);
    for (int64_t i = 0; i < q * hid; ++i) h[i] += tmp[i];
  }
}

}  // namespace dart
