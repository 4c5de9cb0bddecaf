// See decoder.hpp (ops::attention): a layer's attention over the session's K/V cache, every key and value row read
// from memory once per layer, every float computed as by one query head at a time (a tree row equals the plain
// step's row).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "decoder.hpp"
#include "small_gemm.hpp"
#include "thread_pool.hpp"
#include "vector_math.hpp"

namespace dart {
namespace {

#ifdef DART_X86
// p[j] = exp(s[j] - mx) (0 where s[j] is -inf); returns the sum. The value of p[j] and the sum depend
// only on the nonzero numerators in j order, so a tree row, whose masked siblings and later nodes are
// 0s, gets the same bits as the plain decoding step at the same position (whose keys are its prefix and
// ancestors, in another cache slot each): every element goes through exp8 (the tail too, padded), and
// the k-th nonzero numerator is added to lane k % 8 of the sum (adding a 0 changes nothing), lanes
// reduced in a fixed order. Lanes by cache slot would put an ancestor in a different lane in the tree.
__attribute__((target("avx2,fma"))) inline __m256 numerators8(const float* src, __m256 m) {
  const __m256 v = _mm256_loadu_ps(src), ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(v, m)), _mm256_cmp_ps(v, ninf, _CMP_NEQ_OQ));
  // A NaN score stays NaN (as std::exp gives on the portable path): a NaN key must show in the output, on every
  // path, not be dropped as if masked.
  return _mm256_or_ps(e, _mm256_and_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q), v));
}
// Adds one 8-wide step of numerators v (p[0, len) holds the same values; lanes past len are 0) into the 8 lane sums
// acc: 8 nonzero ones by one permute (element i to lane (rank + i) % 8), otherwise each nonzero one in order; rank
// counts the nonzero numerators added so far.
__attribute__((target("avx2,fma"))) inline __m256 add_numerators8(__m256 acc, __m256 v, const float* p, int64_t len,
                                                                  int64_t* rank) {
  const int zeros = _mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_EQ_OQ));
  if (zeros == 0) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i from = _mm256_and_si256(_mm256_sub_epi32(lane, _mm256_set1_epi32(static_cast<int>(*rank & 7))),
                                          _mm256_set1_epi32(7));
    *rank += 8;
    return _mm256_add_ps(acc, _mm256_permutevar8x32_ps(v, from));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  for (int64_t i = 0; i < len; ++i)
    if (p[i] != 0.f) lanes[(*rank)++ & 7] += p[i];
  return _mm256_load_ps(lanes);
}
// Adds the numerators of s[0, n) into lanes[8] (the k-th nonzero one, k counted from s[0], into lane k % 8).
__attribute__((target("avx2,fma"))) void softmax_numerator_lanes_avx2(const float* s, float mx, float* p, int64_t n,
                                                                      float* lanes_io) {
  const __m256 m = _mm256_set1_ps(mx);
  __m256 acc = _mm256_loadu_ps(lanes_io);   // lane l: the nonzero numerators of rank l, l + 8, ...
  int64_t rank = 0;
  alignas(32) float in[8], e[8];
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
    acc = add_numerators8(acc, v, p + j, len, &rank);
  }
  _mm256_storeu_ps(lanes_io, acc);
}

// softmax_numerator_lanes_avx2 with the numerators computed 16 at a time (exp16); each half of 16 then goes into the
// lanes exactly as an 8-wide step of the AVX2 version does, so p and the lanes get the same bits (checked: every
// logit of 17-node trees after 5-777 keys equal to the AVX2 version's, avx512bf16 and avx512 paths). Interleaved on a
// Zen 5 EPYC: trees of 5-17 nodes 0.99x their verify after 300 keys, 0.97-0.99x after 1000.
__attribute__((target("avx512f,avx2,fma"))) void softmax_numerator_lanes_avx512(const float* s, float mx,
                                                                                      float* p, int64_t n,
                                                                                      float* lanes_io) {
  const __m512 m = _mm512_set1_ps(mx), ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 acc = _mm256_loadu_ps(lanes_io);   // lane l: the nonzero numerators of rank l, l + 8, ...
  int64_t rank = 0;
  for (int64_t j = 0; j < n; j += 16) {
    const int64_t len = std::min<int64_t>(16, n - j);
    const __mmask16 live = static_cast<__mmask16>(len == 16 ? 0xFFFFu : (1u << len) - 1u);
    const __m512 v = _mm512_mask_loadu_ps(ninf, live, s + j);   // the tail padded with -inf (numerator 0)
    __m512 e = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, ninf, _CMP_NEQ_OQ), exp16(_mm512_sub_ps(v, m)));
    e = _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), v);   // NaN stays NaN, as on every path
    _mm512_mask_storeu_ps(p + j, live, e);
    acc = add_numerators8(acc, _mm512_castps512_ps256(e), p + j, std::min<int64_t>(8, len), &rank);
    if (len > 8)   // the masked tail's upper lanes are 0, as add_numerators8 expects
      acc = add_numerators8(acc, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)), p + j + 8, len - 8,
                            &rank);
  }
  _mm256_storeu_ps(lanes_io, acc);
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
// p[j] = exp(s[j] - mx) (0 where s[j] is -inf) for j in [0, n), their sum added into lanes[8]: lane k % 8 gets the
// k-th nonzero one on the AVX2 helpers' path, lane 0 a running sum on the plain one. reduce_lanes gives the total.
void softmax_numerator_lanes(const float* s, float mx, float* p, int64_t n, float* lanes) {
#ifdef DART_X86
  if (avx512_helpers()) return softmax_numerator_lanes_avx512(s, mx, p, n, lanes);
  if (avx2_helpers()) return softmax_numerator_lanes_avx2(s, mx, p, n, lanes);
#endif
  float total = lanes[0];
  for (int64_t j = 0; j < n; ++j) {
    p[j] = std::isinf(s[j]) ? 0.f : std::exp(s[j] - mx);
    total += p[j];
  }
  lanes[0] = total;
}

float reduce_lanes(const float* l) { return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7])); }

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

#ifdef DART_X86
// As weighted_rows_shared_avx2 with 16 columns a vector: 16 * C columns of B rows at a time (B * C <= 24 sums of the
// 32 zmm registers), so a head_dim of 64 (B <= 4) or 128 (B <= 3) is one pass over the keys, each value row read
// whole once.
template <int B, int C>
__attribute__((target("avx512f,avx2,fma"))) int64_t weighted_rows_shared_avx512(const float* const* p, const float* v,
                                                                                int64_t n, int64_t D, int64_t c,
                                                                                int64_t c1, float* const* o) {
  for (; c + 16 * C <= c1; c += 16 * C) {
    __m512 acc[B][C];
#pragma GCC unroll 8
    for (int b = 0; b < B; ++b)
#pragma GCC unroll 8
      for (int k = 0; k < C; ++k) acc[b][k] = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
      if (p[0][j] == 0.f) continue;
      const float* vj = v + j * D + c;
      __m512 vk[C];
#pragma GCC unroll 8
      for (int k = 0; k < C; ++k) vk[k] = _mm512_loadu_ps(vj + 16 * k);
#pragma GCC unroll 8
      for (int b = 0; b < B; ++b) {
        const __m512 pj = _mm512_set1_ps(p[b][j]);
#pragma GCC unroll 8
        for (int k = 0; k < C; ++k) acc[b][k] = _mm512_fmadd_ps(pj, vk[k], acc[b][k]);
      }
    }
#pragma GCC unroll 8
    for (int b = 0; b < B; ++b)
#pragma GCC unroll 8
      for (int k = 0; k < C; ++k) _mm512_storeu_ps(o[b] + c + 16 * k, acc[b][k]);
  }
  return c;
}

template <int B>
__attribute__((target("avx512f,avx2,fma"))) void weighted_rows_shared_avx512(const float* const* p, const float* v,
                                                                             int64_t n, int64_t D, int64_t c0,
                                                                             int64_t c1, float* const* o) {
  int64_t c = c0;
  if constexpr (B <= 3) c = weighted_rows_shared_avx512<B, 8>(p, v, n, D, c, c1, o);
  c = weighted_rows_shared_avx512<B, 4>(p, v, n, D, c, c1, o);
  c = weighted_rows_shared_avx512<B, 1>(p, v, n, D, c, c1, o);
  if (c < c1) weighted_rows_shared_avx2<B>(p, v, n, D, c, c1, o);   // the last head_dim % 16 columns
}
#endif

// o_b[c0:c1) = sum_j p_b[j] v[j, c0:c1) for B <= 4 rows sharing their zeros (see weighted_rows_shared_avx2).
void weighted_rows_shared(const float* const* p, int B, const float* v, int64_t n, int64_t D, int64_t c0,
                          int64_t c1, float* const* o) {
#ifdef DART_X86
  if (avx512_helpers()) {
    switch (B) {
      case 1: return weighted_rows_shared_avx512<1>(p, v, n, D, c0, c1, o);
      case 2: return weighted_rows_shared_avx512<2>(p, v, n, D, c0, c1, o);
      case 3: return weighted_rows_shared_avx512<3>(p, v, n, D, c0, c1, o);
      default: return weighted_rows_shared_avx512<4>(p, v, n, D, c0, c1, o);
    }
  }
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

// Attention's scores of one row over n keys: out[j] = t[j] * scale, or -inf where mask[j] == 0 (mask may be null:
// every key visible); returns their maximum (-inf for n == 0). The same products and the same maximum on every path:
// a maximum does not depend on the order it is taken in, and each comparison keeps the running maximum when a score
// is NaN, as std::max(mx, score) does.
float scaled_masked_max_portable(const float* t, const uint8_t* mask, float scale, float* out, int64_t n) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float mx = kNegInf;
  for (int64_t j = 0; j < n; ++j) {
    out[j] = (mask && !mask[j]) ? kNegInf : t[j] * scale;
    mx = std::max(mx, out[j]);
  }
  return mx;
}

#ifdef DART_X86
__attribute__((target("avx2,fma"))) float scaled_masked_max_avx2(const float* t, const uint8_t* mask, float scale,
                                                                 float* out, int64_t n) {
  const __m256 sc = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 mx = ninf;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(t + j), sc);
    if (mask) {
      const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(mask + j));
      const __m256i hidden = _mm256_cmpeq_epi32(_mm256_cvtepu8_epi32(bytes), _mm256_setzero_si256());
      v = _mm256_blendv_ps(v, ninf, _mm256_castsi256_ps(hidden));
    }
    _mm256_storeu_ps(out + j, v);
    mx = _mm256_max_ps(v, mx);   // a NaN score keeps mx (the second operand)
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, mx);
  float m = scaled_masked_max_portable(t + j, mask ? mask + j : nullptr, scale, out + j, n - j);
  for (float l : lanes) m = std::max(m, l);
  return m;
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) float scaled_masked_max_avx512(
    const float* t, const uint8_t* mask, float scale, float* out, int64_t n) {
  const __m512 sc = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 mx = ninf;
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 live = static_cast<__mmask16>(n - j >= 16 ? 0xFFFFu : (1u << (n - j)) - 1u);
    __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(live, t + j), sc);
    if (mask) {
      const __mmask16 seen = _mm_mask_test_epi8_mask(live, _mm_maskz_loadu_epi8(live, mask + j),
                                                     _mm_set1_epi8(static_cast<char>(0xFF)));
      v = _mm512_mask_blend_ps(seen, ninf, v);
    }
    _mm512_mask_storeu_ps(out + j, live, v);
    mx = _mm512_mask_max_ps(mx, live, v, mx);   // a NaN score keeps mx (the second operand)
  }
  return _mm512_reduce_max_ps(mx);
}
#endif

float scaled_masked_max(const float* t, const uint8_t* mask, float scale, float* out, int64_t n) {
#ifdef DART_X86
  if (avx512_helpers()) return scaled_masked_max_avx512(t, mask, scale, out, n);
  if (avx2_helpers()) return scaled_masked_max_avx2(t, mask, scale, out, n);
#endif
  return scaled_masked_max_portable(t, mask, scale, out, n);
}

// How many of a row's `count` visible keys its first key range takes in attention's second pass: half, rounded
// down to a multiple of 8 (so the second range's numerators fill lanes from lane 0 as the whole row's would); none
// below 64 keys (too few to be worth two items).
int64_t split_rank(int64_t count) { return count < 64 ? 0 : count / 2 / 8 * 8; }

// out [q, heads * D] = softmax(q k^T * scale, masked) v, query head h reading K/V head h / group.
//
// In two passes over the K/V heads, each cut across the threads so that every key and every value row is read from
// memory once per layer (per query head, the cache would be read `group` times, and from both cores):
//  1. scores: items (K/V head, range of keys), or for a causal prompt chunk (K/V head, tile of 32 positions) whose
//     keys stop at the tile's last position. All rows of the item (every query head of the group at each position)
//     meet its keys in one small GEMM; scaled, masked and their maxima taken on vector registers
//     (scaled_masked_max: a scalar loop over every score of every tree row cost trees of 5-17 nodes 1-5% of their
//     verify, measured interleaved on a Zen 5 EPYC after 300-1000 keys); each item keeps its rows' maxima.
//  2. outputs: items (K/V head, one of two key ranges per row: its first split_rank visible keys, the rest). Per row
//     and range: the softmax numerators (the row's maximum over pass 1's ranges subtracted) into 8 lane sums, and
//     the weighted sum of the range's value rows, for the group's query heads at once (one mask per position). Each
//     item streams whole value rows, on AVX-512 paths in one pass over its keys (weighted_rows_shared_avx512). Then
//     per row: (first range's sums + second's) / (lanes added, reduced). Measured on a Zen 5 EPYC against items by
//     (K/V head, half of the columns) with the AVX2 sums, bundled SmolLM2 bf16, 2 threads, interleaved: one token
//     0.96-0.99x after 150-1000 keys, trees of 5 and 9 nodes 0.95 / 0.93x after 500 keys, 0.90x after 1000.
// Every float is computed as by one query head at a time (a score by the kernel's fixed K order, a maximum exactly,
// the numerators, each range's column sums in key order, the split by the count of visible keys), so a tree row
// still equals the plain step's row.
void attention_impl(const DecoderShape& s, const float* qs, const LayerCache& cache, int64_t capacity,
                    float* out,
               int64_t q, int64_t start, const uint8_t* allowed, int threads) {
  const int64_t H = s.heads, KV = s.kv_heads, D = s.head_dim, G = s.heads / s.kv_heads, end = start + q;
  const int64_t R = q * G;   // rows per K/V head: r = i * G + g is query position i, query head kvh * G + g
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  // Causal rows (a prompt chunk) run pass 1 in tiles of kTile positions, each meeting only the keys its last row
  // sees: the scores above the diagonal are not computed (a 256-row chunk from position 0 skips half of them). The
  // tiles are the items then (the longest first), not key ranges. A score is the same dot product either way.
  constexpr int64_t kTile = 32;
  const bool tiled = allowed == nullptr && q >= 2 * kTile;
  const int64_t row_tiles = tiled ? (q + kTile - 1) / kTile : 1;
  // Pass 1's key ranges: at least 64 keys each.
  const int64_t key_parts =
      tiled ? 1 : threads > 1 ? std::max<int64_t>(1, std::min<int64_t>(threads, end / 64)) : 1;
  // The scores of a batch of K/V heads at a time: at most about 16 MiB of them (long prompt chunks).
  const int64_t batch = std::max<int64_t>(1, std::min<int64_t>(KV, (int64_t{4} << 20) / std::max<int64_t>(1, R * end)));
  // The calling thread's buffers; the pool's threads write disjoint parts.
  thread_local std::vector<float> scores, maxima, row_maxima, outs, lane_sums;
  thread_local std::vector<int64_t> splits;
  scores.resize(static_cast<size_t>(batch * R * end));
  maxima.resize(static_cast<size_t>(batch * R * key_parts));
  row_maxima.resize(static_cast<size_t>(batch * R));
  outs.resize(static_cast<size_t>(2 * batch * R * D));
  lane_sums.resize(static_cast<size_t>(2 * batch * R * 8));
  splits.resize(static_cast<size_t>(q));
  float* const sc = scores.data();          // [K/V head - first][row][key]
  float* const mx_parts = maxima.data();    // [K/V head - first][row][key range]
  float* const row_max = row_maxima.data(); // [K/V head - first][row]
  float* const part_out = outs.data();      // [key range][K/V head - first][row][D]: partial weighted sums
  float* const part_lanes = lane_sums.data();   // [key range][K/V head - first][row][8]: partial numerator lanes
  int64_t* const split_at = splits.data();  // [position]: the cache slot where a row's second key range starts
  auto last_of = [&](int64_t i) { return allowed ? end : start + i + 1; };   // causal: up to the position itself
  // A row's keys split after the first split_rank(count) visible ones, count = its visible keys: a function of the
  // position alone (a tree node sees its prefix, its ancestors and itself, as many keys as the plain step there),
  // so a tree row and the plain step's row split at the same key and sum the same terms in the same order.
  for (int64_t i = 0; i < q; ++i) {
    const uint8_t* row = allowed ? allowed + i * end : nullptr;
    int64_t count = last_of(i);
    if (row) count = std::count_if(row, row + end, [](uint8_t a) { return a != 0; });
    const int64_t rank = split_rank(count);
    int64_t slot = rank;   // causal rows see keys [0, last): the rank-th visible key is slot rank
    if (row)
      for (int64_t seen = 0, j = 0; j < end; ++j) {
        if (seen == rank) { slot = j; break; }
        seen += row[j] != 0;
      }
    split_at[i] = slot;
  }
  for (int64_t first = 0; first < KV; first += batch) {
    const int64_t heads_now = std::min(batch, KV - first);

    parallel_for_items(threads, heads_now * key_parts * row_tiles, [&](int64_t item) {
      const int64_t tile = row_tiles - 1 - item % row_tiles, rest = item / row_tiles;
      const int64_t kvh = first + rest / key_parts, part = rest % key_parts;
      const int64_t i0 = tile * kTile, i1 = tiled ? std::min(q, i0 + kTile) : q;
      const int64_t j0 = end * part / key_parts;
      const int64_t j1 = tiled ? start + i1 : end * (part + 1) / key_parts;   // a tile's last row sees keys < start + i1
      const int64_t r0 = i0 * G, r1 = i1 * G;
      thread_local std::vector<float> qg, tmp;
      qg.resize(static_cast<size_t>((r1 - r0) * D));
      tmp.resize(static_cast<size_t>((r1 - r0) * (j1 - j0)));
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t g = 0; g < G; ++g)
          std::copy_n(qs + (i * H + kvh * G + g) * D, D, qg.data() + (i * G + g - r0) * D);
      small_gemm_f32(qg.data(), cache.keys + (kvh * capacity + j0) * D, tmp.data(), r1 - r0, j1 - j0, D, 1);
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t i = r / G, hi = std::min(j1, last_of(i));
        const uint8_t* row = allowed ? allowed + i * end : nullptr;
        float* sr = sc + ((kvh - first) * R + r) * end;
        const float* t = tmp.data() + (r - r0) * (j1 - j0);
        mx_parts[((kvh - first) * R + r) * key_parts + part] =
            hi > j0 ? scaled_masked_max(t, row ? row + j0 : nullptr, scale, sr + j0, hi - j0) : kNegInf;
      }
    });

    for (int64_t row = 0; row < heads_now * R; ++row) {
      float mx = kNegInf;
      for (int64_t k = 0; k < key_parts; ++k) mx = std::max(mx, mx_parts[row * key_parts + k]);
      row_max[row] = mx;
    }

    // 2. outputs, in two key ranges per row (split_at: the first visible keys, then the rest): each item streams one
    // K/V head's value rows of one range, for every row of the head's group, into partial sums and numerator lanes.
    parallel_for_items(threads, heads_now * 2, [&](int64_t item) {
      const int64_t kvh = first + item / 2, part = item % 2;
      const float* values = cache.values + kvh * capacity * D;
      thread_local std::vector<float> p;
      p.resize(static_cast<size_t>(G * end));
      for (int64_t i = 0; i < q; ++i) {
        const int64_t j0 = part ? split_at[i] : 0, j1 = part ? last_of(i) : split_at[i];
        for (int64_t g0 = 0; g0 < G; g0 += 4) {   // up to 4 query heads at once
          const int B = static_cast<int>(std::min<int64_t>(4, G - g0));
          const float* pb[4];
          float* ob[4];
          int live = 0;
          for (int b = 0; b < B; ++b) {
            const int64_t r = i * G + g0 + b, row = (kvh - first) * R + r;
            float* o = part_out + (part * batch * R + row) * D;
            float* lanes = part_lanes + (part * batch * R + row) * 8;
            std::fill(o, o + D, 0.f);
            std::fill(lanes, lanes + 8, 0.f);
            const float mx = row_max[row];
            if (mx == kNegInf || j1 <= j0) continue;   // no visible key (never in a valid tree) or an empty range
            float* pr = p.data() + (g0 + b) * end;
            softmax_numerator_lanes(sc + row * end + j0, mx, pr + j0, j1 - j0, lanes);
            pb[live] = pr + j0;
            ob[live] = o;
            ++live;
          }
          if (live > 0) weighted_rows_shared(pb, live, values + j0 * D, j1 - j0, D, 0, D, ob);
        }
      }
    });

    // Each row: (range 1's sum + range 2's) / (the numerators' total), the lanes of the two ranges added first.
    for (int64_t kvh = first; kvh < first + heads_now; ++kvh)
      for (int64_t r = 0; r < R; ++r) {
        const int64_t row = (kvh - first) * R + r, i = r / G, g = r % G;
        float* o = out + (i * H + kvh * G + g) * D;
        if (row_max[row] == kNegInf) {
          std::fill(o, o + D, 0.f);
          continue;
        }
        const float* o0 = part_out + row * D;
        const float* o1 = part_out + (batch * R + row) * D;
        const float* l0 = part_lanes + row * 8;
        const float* l1 = part_lanes + (batch * R + row) * 8;
        float lanes[8];
        for (int k = 0; k < 8; ++k) lanes[k] = l0[k] + l1[k];
        const float inv = 1.0f / reduce_lanes(lanes);
        for (int64_t d = 0; d < D; ++d) o[d] = (o0[d] + o1[d]) * inv;
      }
  }
}

}  // namespace

namespace ops {
void attention(const DecoderShape& s, const float* qs, const LayerCache& cache, int64_t capacity, float* out,
               int64_t q, int64_t start, const uint8_t* allowed, int threads) {
  attention_impl(s, qs, cache, capacity, out, q, start, allowed, threads);
}
}  // namespace ops

}  // namespace dart
