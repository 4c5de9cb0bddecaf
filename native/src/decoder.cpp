// See decoder.hpp. The arithmetic follows the HF modules it replaces (RMSNorm as
// w * (x * rsqrt(mean(x^2) + eps)), RoPE as x * cos + rotate_half(x) * sin, softmax with the
// row maximum subtracted); sums run in a different order, so results agree to float32
// rounding, not bit for bit.
#include "decoder.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "small_gemm.hpp"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define DART_X86 1
#endif

namespace dart {
namespace {

// The AVX2 helpers below (exp, softmax, SiLU, weighted sums) run on the avx2 and avx512 GEMM paths; forcing
// the portable path (DART_GEMM_PATH=portable, tests) runs the plain loops, as on a non-x86 CPU.
inline bool avx2_helpers() { return small_gemm_path() != GemmPath::Portable; }

void project(const DecoderShape& s, const float* x, const void* w, const float* bias, float* y, int64_t M,
             int64_t N, int64_t K, int threads) {
  if (s.bf16_weights)
    small_gemm_bf16(x, static_cast<const uint16_t*>(w), y, M, N, K, threads);
  else
    small_gemm_f32(x, static_cast<const float*>(w), y, M, N, K, threads);
  if (bias)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) y[m * N + n] += bias[n];
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
// exp(x) for 8 lanes, Cephes' single-precision polynomial (about 1 ulp over the softmax range;
// inputs below -87.3 give ~1e-38, not 0: callers zero masked lanes themselves).
__attribute__((target("avx2,fma"))) inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3365478515625f)), _mm256_set1_ps(88.3762626647949f));
  __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(0.693359375f)));
  x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(-2.12194440e-4f)));
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i pow2 = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(pow2));
}

// p[j] = exp(s[j] - mx) (0 where s[j] is -inf); returns the sum. The value of p[j] and the sum depend
// only on the nonzero numerators in j order, so a tree row, whose masked siblings and later nodes are
// 0s, gets the same bits as the plain decoding step at the same position (whose keys are its prefix and
// ancestors, in another cache slot each): every element goes through exp8 (the tail too, padded), and
// the k-th nonzero numerator is added to lane k % 8 of the sum (adding a 0 changes nothing), lanes
// reduced in a fixed order. Lanes by cache slot would put an ancestor in a different lane in the tree.
__attribute__((target("avx2,fma"))) inline __m256 numerators8(const float* src, __m256 m) {
  const __m256 v = _mm256_loadu_ps(src), ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  return _mm256_and_ps(exp8(_mm256_sub_ps(v, m)), _mm256_cmp_ps(v, ninf, _CMP_NEQ_OQ));
}
__attribute__((target("avx2,fma"))) float softmax_numerators_avx2(const float* s, float mx, float* p, int64_t n) {
  const __m256 m = _mm256_set1_ps(mx);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256 acc = _mm256_setzero_ps();   // lane l: the nonzero numerators of rank l, l + 8, ...
  int64_t rank = 0;
  alignas(32) float in[8], e[8], lanes[8];
  for (int64_t j = 0; j < n; j += 8) {
    const int64_t len = std::min<int64_t>(8, n - j);
    __m256 v;
    if (len == 8) {
      v = numerators8(s + j, m);
    } else {   // the tail, padded with -inf (numerator 0)
      std::fill(in, in + 8, -std::numeric_limits<float>::infinity());
      std::copy(s + j, s + n, in);
      v = numerators8(in, m);
    }
    if (len == 8) {
      _mm256_storeu_ps(p + j, v);
    } else {
      _mm256_store_ps(e, v);
      std::copy(e, e + len, p + j);
    }
    const int zeros = _mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_EQ_OQ));
    if (zeros == 0) {   // 8 nonzero: element i goes to lane (rank + i) % 8
      const __m256i from = _mm256_and_si256(_mm256_sub_epi32(lane, _mm256_set1_epi32(static_cast<int>(rank & 7))),
                                            _mm256_set1_epi32(7));
      acc = _mm256_add_ps(acc, _mm256_permutevar8x32_ps(v, from));
      rank += 8;
    } else {
      _mm256_store_ps(lanes, acc);
      for (int64_t i = j; i < j + len; ++i)
        if (p[i] != 0.f) lanes[rank++ & 7] += p[i];
      acc = _mm256_load_ps(lanes);
    }
  }
  _mm256_store_ps(lanes, acc);
  return ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
}

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

#ifdef DART_X86
__attribute__((target("avx2,fma"))) void axpy_avx2(float a, const float* x, float* y, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}
#endif
float softmax_numerators(const float* s, float mx, float* p, int64_t n) {
#ifdef DART_X86
  if (avx2_helpers()) return softmax_numerators_avx2(s, mx, p, n);
#endif
  float total = 0.f;
  for (int64_t j = 0; j < n; ++j) {
    p[j] = std::isinf(s[j]) ? 0.f : std::exp(s[j] - mx);
    total += p[j];
  }
  return total;
}

void silu_mul(float* g, const float* u, int64_t n) {
#ifdef DART_X86
  if (avx2_helpers()) return silu_mul_avx2(g, u, n);
#endif
  for (int64_t i = 0; i < n; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

#ifdef DART_X86
// o_b[c] = sum_j p_b[j] * v[j, c] over the columns [c0, c1) for B rows p_b that share their zeros (the query heads of
// one K/V head at one position: the same mask), j in order, skipping the zeros; 8 * C columns at a time, so that
// B * C sums are in flight (each is a chain of dependent FMAs). Each column is summed from zero, one FMA per key in
// key order, whatever B, C and the column range: a row gets the same bits alone or with others.
template <int B, int C>
__attribute__((target("avx2,fma"))) int64_t weighted_rows_shared_avx2(const float* const* p, const float* v,
                                                                      int64_t n, int64_t D, int64_t c, int64_t c1,
                                                                      float* const* o) {
  for (; c + 8 * C <= c1; c += 8 * C) {
    __m256 acc[B][C];
#pragma GCC unroll 4
    for (int b = 0; b < B; ++b)
#pragma GCC unroll 4
      for (int k = 0; k < C; ++k) acc[b][k] = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
      if (p[0][j] == 0.f) continue;
      const float* vj = v + j * D + c;
#pragma GCC unroll 4
      for (int b = 0; b < B; ++b) {
        const __m256 pj = _mm256_set1_ps(p[b][j]);
#pragma GCC unroll 4
        for (int k = 0; k < C; ++k) acc[b][k] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8 * k), acc[b][k]);
      }
    }
#pragma GCC unroll 4
    for (int b = 0; b < B; ++b)
#pragma GCC unroll 4
      for (int k = 0; k < C; ++k) _mm256_storeu_ps(o[b] + c + 8 * k, acc[b][k]);
  }
  return c;
}

template <int B>
__attribute__((target("avx2,fma"))) void weighted_rows_shared_avx2(const float* const* p, const float* v, int64_t n,
                                                                   int64_t D, int64_t c0, int64_t c1,
                                                                   float* const* o) {
  // About 12 sums in flight where the registers allow (16 ymm: the sums, a broadcast, a loaded value).
  int64_t c = weighted_rows_shared_avx2<B, B <= 3 ? 4 : 2>(p, v, n, D, c0, c1, o);
  c = weighted_rows_shared_avx2<B, 1>(p, v, n, D, c, c1, o);   // whole 8-column groups left over
  if (c < c1)   // head_dim not a multiple of 8: the last columns through axpy_avx2
    for (int b = 0; b < B; ++b) {
      std::fill(o[b] + c, o[b] + c1, 0.f);
      for (int64_t j = 0; j < n; ++j)
        if (p[b][j] != 0.f) axpy_avx2(p[b][j], v + j * D + c, o[b] + c, c1 - c);
    }
}
#endif

// o_b[c0:c1) = sum_j p_b[j] v[j, c0:c1) for B <= 4 rows sharing their zeros (see weighted_rows_shared_avx2).
void weighted_rows_shared(const float* const* p, int B, const float* v, int64_t n, int64_t D, int64_t c0,
                          int64_t c1, float* const* o) {
#ifdef DART_X86
  if (avx2_helpers()) {
    switch (B) {
      case 1: return weighted_rows_shared_avx2<1>(p, v, n, D, c0, c1, o);
      case 2: return weighted_rows_shared_avx2<2>(p, v, n, D, c0, c1, o);
      case 3: return weighted_rows_shared_avx2<3>(p, v, n, D, c0, c1, o);
      default: return weighted_rows_shared_avx2<4>(p, v, n, D, c0, c1, o);
    }
  }
#endif
  for (int b = 0; b < B; ++b) {
    std::fill(o[b] + c0, o[b] + c1, 0.f);
    for (int64_t j = 0; j < n; ++j)
      if (p[b][j] != 0.f)
        for (int64_t c = c0; c < c1; ++c) o[b][c] += p[b][j] * v[j * D + c];
  }
}

// out [q, heads * D] = softmax(q k^T * scale, masked) v, query head h reading K/V head h / group.
//
// In two passes over the K/V heads, each cut across the threads so that every key and every value row is read from
// memory once per layer (per query head, the cache would be read `group` times, and from both cores):
//  1. scores: items (K/V head, range of keys). All rows of the head's group (every query head at every position)
//     meet the range's keys in one small GEMM; scaled, masked; each item keeps its rows' maxima.
//  2. outputs: items (K/V head, range of value columns). Per row: the maximum over the ranges, the softmax
//     numerators (softmax_numerators, over the whole row: an item needs them all), then the weighted sum of the
//     value rows over the item's columns, for the group's query heads at once (one mask per position).
// Every float is computed as by one query head at a time (a score by the kernel's fixed K order, a maximum exactly,
// the numerators and each output column's sum in key order), so a tree row still equals the plain step's row.
void attention(const DecoderShape& s, const float* qs, const LayerCache& cache, int64_t capacity, float* out,
               int64_t q, int64_t start, const uint8_t* allowed, int threads) {
  const int64_t H = s.heads, KV = s.kv_heads, D = s.head_dim, G = s.heads / s.kv_heads, end = start + q;
  const int64_t R = q * G;   // rows per K/V head: r = i * G + g is query position i, query head kvh * G + g
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  // Key ranges of at least 64 keys; value columns in two halves where each half is whole 16-column lines.
  const int64_t key_parts = threads > 1 ? std::max<int64_t>(1, std::min<int64_t>(threads, end / 64)) : 1;
  const int64_t col_parts = (threads > 1 && avx2_helpers() && D % 32 == 0) ? 2 : 1;
  // The scores of a batch of K/V heads at a time: at most about 16 MiB of them (long prompt chunks).
  const int64_t batch = std::max<int64_t>(1, std::min<int64_t>(KV, (int64_t{4} << 20) / std::max<int64_t>(1, R * end)));
  thread_local std::vector<float> scores, maxima;   // the calling thread's; the pool's threads write disjoint parts
  scores.resize(static_cast<size_t>(batch * R * end));
  maxima.resize(static_cast<size_t>(batch * R * key_parts));
  float* const sc = scores.data();        // [K/V head - first][row][key]
  float* const mx_parts = maxima.data();  // [K/V head - first][row][key range]
  auto last_of = [&](int64_t i) { return allowed ? end : start + i + 1; };   // causal: up to the position itself
  for (int64_t first = 0; first < KV; first += batch) {
    const int64_t heads_now = std::min(batch, KV - first);

    parallel_for_items(threads, heads_now * key_parts, [&](int64_t item) {
      const int64_t kvh = first + item / key_parts, part = item % key_parts;
      const int64_t j0 = end * part / key_parts, j1 = end * (part + 1) / key_parts;
      thread_local std::vector<float> qg, tmp;
      qg.resize(static_cast<size_t>(R * D));
      tmp.resize(static_cast<size_t>(R * (j1 - j0)));
      for (int64_t i = 0; i < q; ++i)
        for (int64_t g = 0; g < G; ++g) std::copy_n(qs + (i * H + kvh * G + g) * D, D, qg.data() + (i * G + g) * D);
      small_gemm_f32(qg.data(), cache.keys + (kvh * capacity + j0) * D, tmp.data(), R, j1 - j0, D, 1);
      for (int64_t r = 0; r < R; ++r) {
        const int64_t i = r / G, hi = std::min(j1, last_of(i));
        const uint8_t* row = allowed ? allowed + i * end : nullptr;
        float* sr = sc + ((kvh - first) * R + r) * end;
        const float* t = tmp.data() + r * (j1 - j0);
        float mx = kNegInf;
        for (int64_t j = j0; j < hi; ++j) {
          sr[j] = (row && !row[j]) ? kNegInf : t[j - j0] * scale;
          mx = std::max(mx, sr[j]);
        }
        mx_parts[((kvh - first) * R + r) * key_parts + part] = mx;
      }
    });

    parallel_for_items(threads, heads_now * col_parts, [&](int64_t item) {
      const int64_t kvh = first + item / col_parts, part = item % col_parts;
      const int64_t c0 = D * part / col_parts, c1 = D * (part + 1) / col_parts;
      const float* values = cache.values + kvh * capacity * D;
      thread_local std::vector<float> p;
      p.resize(static_cast<size_t>(G * end));
      for (int64_t i = 0; i < q; ++i) {
        const int64_t last = last_of(i);
        for (int64_t g0 = 0; g0 < G; g0 += 4) {   // up to 4 query heads at once
          const int B = static_cast<int>(std::min<int64_t>(4, G - g0));
          const float* pb[4];
          float* ob[4];
          float inv[4];
          int live = 0;
          for (int b = 0; b < B; ++b) {
            const int64_t r = i * G + g0 + b;
            float mx = kNegInf;
            for (int64_t k = 0; k < key_parts; ++k) mx = std::max(mx, mx_parts[((kvh - first) * R + r) * key_parts + k]);
            float* o = out + (i * H + kvh * G + g0 + b) * D;
            if (mx == kNegInf) {  // no visible key (never in a valid tree): output 0
              std::fill(o + c0, o + c1, 0.f);
              continue;
            }
            float* pr = p.data() + (g0 + b) * end;
            inv[live] = 1.0f / softmax_numerators(sc + ((kvh - first) * R + r) * end, mx, pr, last);
            pb[live] = pr;
            ob[live] = o;
            ++live;
          }
          if (live == 0) continue;
          weighted_rows_shared(pb, live, values, last, D, c0, c1, ob);
          for (int b = 0; b < live; ++b)
            for (int64_t d = c0; d < c1; ++d) ob[b][d] *= inv[b];
        }
      }
    });
  }
}

}  // namespace

// The layer pieces the draft heads reuse (head_step.cpp), forwarding to the ones above.
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
void attention(const DecoderShape& s, const float* qs, const LayerCache& cache, int64_t capacity, float* out,
               int64_t q, int64_t start, const uint8_t* allowed, int threads) {
  dart::attention(s, qs, cache, capacity, out, q, start, allowed, threads);
}
void silu_mul(float* g, const float* u, int64_t n) { dart::silu_mul(g, u, n); }
}  // namespace ops

void decoder_layers(const DecoderShape& s, const std::vector<LayerWeights>& layers,
                    const std::vector<LayerCache>& caches, int64_t capacity, int64_t begin, int64_t end, float* h,
                    int64_t q, const float* cos, const float* sin, const uint8_t* allowed, int64_t start,
                    int threads) {
  if (begin < 0 || end > static_cast<int64_t>(layers.size()) || begin > end || caches.size() != layers.size())
    throw std::invalid_argument("decoder_layers: layer range or cache count does not match the model");
  if (q < 0 || start < 0 || start + q > capacity)
    throw std::invalid_argument("decoder_layers: positions outside the cache");
  if (q == 0 || begin == end) return;   // nothing to run (an empty prompt chunk)
  if (s.head_dim % 2 != 0) throw std::invalid_argument("decoder_layers: RoPE needs an even head_dim");
  const int64_t H = s.heads, KV = s.kv_heads, D = s.head_dim, hid = s.hidden, I = s.intermediate;
  std::vector<float> x(q * hid), qs(q * H * D), ks(q * KV * D), vs(q * KV * D), attn(q * H * D), tmp(q * hid),
      gate(q * I), up(q * I);
  for (int64_t l = begin; l < end; ++l) {
    const LayerWeights& w = layers[l];
    const LayerCache& c = caches[l];
    rms_norm(h, w.in_norm, x.data(), q, hid, s.eps);
    project(s, x.data(), w.q, w.q_bias, qs.data(), q, H * D, hid, threads);
    project(s, x.data(), w.k, w.k_bias, ks.data(), q, KV * D, hid, threads);
    project(s, x.data(), w.v, w.v_bias, vs.data(), q, KV * D, hid, threads);
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
    attention(s, qs.data(), c, capacity, attn.data(), q, start, allowed, threads);
    project(s, attn.data(), w.o, nullptr, tmp.data(), q, hid, H * D, threads);
    for (int64_t i = 0; i < q * hid; ++i) h[i] += tmp[i];
    rms_norm(h, w.post_norm, x.data(), q, hid, s.eps);
    project(s, x.data(), w.gate, nullptr, gate.data(), q, I, hid, threads);
    project(s, x.data(), w.up, nullptr, up.data(), q, I, hid, threads);
    silu_mul(gate.data(), up.data(), q * I);
    project(s, gate.data(), w.down, nullptr, tmp.data(), q, hid, I, threads);
    for (int64_t i = 0; i < q * hid; ++i) h[i] += tmp[i];
  }
}

}  // namespace dart
