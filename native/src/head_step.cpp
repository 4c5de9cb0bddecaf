// See head_step.hpp. The torch heads (dart_core/models/heads/{dart,eagle3}.py) are the reference:
// x = cat[input_layernorm(embed(next token)), hidden_norm(h)], residual h; q/k/v over x with RoPE;
// attention over the head's cache; residual + o_proj; + MLP(post_attention_layernorm); then
// lm_head(norm(...)) (DART normalises twice, as the original's forward + compute_logits).
#include "head_step.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace dart {
namespace {

DecoderShape layer_shape(const HeadShape& s) {
  DecoderShape d;
  d.hidden = s.hidden;
  d.heads = s.heads;
  d.kv_heads = s.kv_heads;
  d.head_dim = s.head_dim;
  d.intermediate = s.intermediate;
  d.eps = s.eps;
  d.bf16_weights = s.bf16_weights;
  return d;
}

void embed_row(const HeadShape& s, const void* embed, int64_t id, float* out) {
  const int64_t H = s.hidden;
  if (s.bf16_embed) {
    const uint16_t* r = static_cast<const uint16_t*>(embed) + id * H;
    for (int64_t i = 0; i < H; ++i) {
      const uint32_t bits = static_cast<uint32_t>(r[i]) << 16;
      std::memcpy(out + i, &bits, sizeof(float));
    }
  } else {
    std::memcpy(out, static_cast<const float*>(embed) + id * H, static_cast<size_t>(H) * sizeof(float));
  }
}

// The head's input rows: x [rows, 2H] = [input_norm(embed(ids)), hidden_norm(h)], residual = h.
void input_rows(const HeadShape& s, const HeadWeights& w, const float* h, const int64_t* ids, int64_t rows, float* x,
                float* residual) {
  const int64_t H = s.hidden;
  std::vector<float> e(static_cast<size_t>(H));
  for (int64_t i = 0; i < rows; ++i) {
    embed_row(s, w.embed, ids[i], e.data());
    ops::rms_norm(e.data(), w.input_norm, x + i * 2 * H, 1, H, s.eps);
    ops::rms_norm(h + i * H, w.hidden_norm, x + i * 2 * H + H, 1, H, s.eps);
  }
  std::copy_n(h, rows * H, residual);
}

// cos / sin [rows, D] for integer positions: freqs = position * inv_freq (float32), duplicated over the two halves.
void rope_tables(const float* inv_freq, const int64_t* positions, int64_t rows, int64_t D, float* cos, float* sin) {
  const int64_t half = D / 2;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < half; ++i) {
      const float f = static_cast<float>(positions[r]) * inv_freq[i];
      cos[r * D + i] = cos[r * D + i + half] = std::cos(f);
      sin[r * D + i] = sin[r * D + i + half] = std::sin(f);
    }
}

// The decoder layer over N rows: every row's K/V goes to cache slots write_at..write_at+N-1; rows keep..N-1
// attend to slots [0, write_at + row + 1) (allowed null: causal) or as `allowed` [N - keep, write_at + N]
// says, then residual + o_proj and the MLP -> out [N - keep, H].
void layer(const HeadShape& s, const HeadWeights& w, const HeadCacheView& c, const float* x, const float* residual,
           int64_t N, const int64_t* positions, int64_t write_at, int64_t keep, const uint8_t* allowed, float* out,
           int threads) {
  const DecoderShape ds = layer_shape(s);
  const int64_t H = s.hidden, A = s.heads, KV = s.kv_heads, D = s.head_dim, I = s.intermediate, X = 2 * H;
  const int64_t R = N - keep;   // rows that go on past attention
  std::vector<float> qs(R * A * D), ks(N * KV * D), vs(N * KV * D), cos(N * D), sin(N * D), attn(R * A * D),
      tmp(R * H), post(R * H), gate(R * I), up(R * I);
  ops::project(ds, x + keep * X, w.q, nullptr, qs.data(), R, A * D, X, threads);
  ops::project(ds, x, w.k, nullptr, ks.data(), N, KV * D, X, threads);
  ops::project(ds, x, w.v, nullptr, vs.data(), N, KV * D, X, threads);
  rope_tables(w.inv_freq, positions, N, D, cos.data(), sin.data());
  ops::rope(qs.data(), R, A, D, cos.data() + keep * D, sin.data() + keep * D);
  ops::rope(ks.data(), N, KV, D, cos.data(), sin.data());
  for (int64_t i = 0; i < N; ++i)
    for (int64_t h = 0; h < KV; ++h) {
      const size_t slot = static_cast<size_t>((h * c.capacity + write_at + i) * D);
      std::copy_n(ks.data() + (i * KV + h) * D, D, c.keys + slot);
      std::copy_n(vs.data() + (i * KV + h) * D, D, c.values + slot);
    }
  ops::attention(ds, qs.data(), LayerCache{c.keys, c.values}, c.capacity, attn.data(), R, write_at + keep, allowed,
                 threads);
  ops::project(ds, attn.data(), w.o, nullptr, tmp.data(), R, H, A * D, threads);
  for (int64_t i = 0; i < R * H; ++i) out[i] = residual[keep * H + i] + tmp[i];
  ops::rms_norm(out, w.post_norm, post.data(), R, H, s.eps);
  ops::project(ds, post.data(), w.gate, nullptr, gate.data(), R, I, H, threads);
  ops::project(ds, post.data(), w.up, nullptr, up.data(), R, I, H, threads);
  ops::silu_mul(gate.data(), up.data(), R * I);
  ops::project(ds, gate.data(), w.down, nullptr, tmp.data(), R, H, I, threads);
  for (int64_t i = 0; i < R * H; ++i) out[i] += tmp[i];
}

// logits [rows, V_d] = lm_head(norm^times(hidden)).
void lm_head(const HeadShape& s, const HeadWeights& w, const float* hidden, int64_t rows, int times, float* logits,
             int threads) {
  std::vector<float> normed(hidden, hidden + rows * s.hidden);
  for (int t = 0; t < times; ++t) ops::rms_norm(normed.data(), w.norm, normed.data(), rows, s.hidden, s.eps);
  ops::project(layer_shape(s), normed.data(), w.lm_head, nullptr, logits, rows, s.draft_vocab, s.hidden, threads);
}

// In place, per row: x - logsumexp(x) (the sum in double).
void log_softmax_rows(float* x, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * n;
    const float mx = *std::max_element(row, row + n);
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(row[i]) - mx);
    const float lse = mx + static_cast<float>(std::log(sum));
    for (int64_t i = 0; i < n; ++i) row[i] -= lse;
  }
}

// Each row's top.top_k values, descending, ties to the lower draft id; their draft ids mapped through d2t.
// One pass keeping a sorted list of k (k is a few dozen, V_d thousands: most values fail the first compare).
// A NaN never enters; a row with fewer than k comparable values is padded with NaN, which the pruner refuses.
void top_k_rows(const float* x, int64_t rows, int64_t n, const int64_t* d2t, const TopK& top) {
  const int64_t k = top.top_k;
  std::vector<float> val(static_cast<size_t>(k));
  std::vector<int64_t> idx(static_cast<size_t>(k));
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * n;
    int64_t count = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float v = row[i];
      if (count == k ? !(v > val[k - 1]) : std::isnan(v)) continue;
      int64_t p = count < k ? count++ : k - 1;
      while (p > 0 && val[p - 1] < v) {   // strictly smaller moves down: equal values keep the lower id first
        val[p] = val[p - 1];
        idx[p] = idx[p - 1];
        --p;
      }
      val[p] = v;
      idx[p] = i;
    }
    for (int64_t j = 0; j < k; ++j) {
      const bool have = j < count;
      top.values[r * k + j] = have ? val[j] : std::numeric_limits<float>::quiet_NaN();
      top.tokens[r * k + j] = have ? idx[j] + d2t[idx[j]] : 0;
    }
  }
}

}  // namespace

void dart_head_step(const HeadShape& s, const HeadWeights& w, const HeadCacheView& cache, const float* aux,
                    const int64_t* next_ids, int64_t n, int64_t start, int64_t levels, float* logits, const TopK& top,
                    int threads) {
  const int64_t H = s.hidden, N = n + levels - 1;
  std::vector<float> h(n * H), x(N * 2 * H), residual(N * H), hidden(levels * H);
  std::vector<int64_t> positions(N);
  ops::project(layer_shape(s), aux, w.fc, nullptr, h.data(), n, H, s.fc_in, threads);
  input_rows(s, w, h.data(), next_ids, n, x.data(), residual.data());
  for (int64_t j = n; j < N; ++j) {   // mask slots: mask_rep as the input, its first half as the residual
    std::copy_n(w.mask_rep, 2 * H, x.data() + j * 2 * H);
    std::copy_n(w.mask_rep, H, residual.data() + j * H);
  }
  for (int64_t i = 0; i < N; ++i) positions[i] = start + i;
  layer(s, w, cache, x.data(), residual.data(), N, positions.data(), start, n - 1, nullptr, hidden.data(), threads);
  lm_head(s, w, hidden.data(), levels, 2, logits, threads);
  top_k_rows(logits, levels, s.draft_vocab, w.d2t, top);
}

void eagle3_real_step(const HeadShape& s, const HeadWeights& w, const HeadCacheView& cache, const float* aux,
                      const int64_t* next_ids, int64_t n, int64_t start, float* g, float* logp, const TopK& top,
                      int threads) {
  const int64_t H = s.hidden;
  std::vector<float> h(n * H), x(n * 2 * H), residual(n * H);
  std::vector<int64_t> positions(n);
  ops::project(layer_shape(s), aux, w.fc, nullptr, h.data(), n, H, s.fc_in, threads);
  input_rows(s, w, h.data(), next_ids, n, x.data(), residual.data());
  for (int64_t i = 0; i < n; ++i) positions[i] = start + i;
  layer(s, w, cache, x.data(), residual.data(), n, positions.data(), start, n - 1, nullptr, g, threads);
  lm_head(s, w, g, 1, 1, logp, threads);
  log_softmax_rows(logp, 1, s.draft_vocab);
  top_k_rows(logp, 1, s.draft_vocab, w.d2t, top);
}

void eagle3_tree_step(const HeadShape& s, const HeadWeights& w, const HeadCacheView& cache, const float* h,
                      const int64_t* ids, int64_t n, int64_t position, int64_t real, int64_t tree_start,
                      const uint8_t* tree_allowed, float* g, float* logp, const TopK& top, int threads) {
  const int64_t H = s.hidden, width = tree_start + n, tree_width = tree_start - real + n;
  std::vector<float> x(n * 2 * H), residual(n * H);
  std::vector<int64_t> positions(n, position);
  std::vector<uint8_t> allowed(static_cast<size_t>(n * width));
  for (int64_t i = 0; i < n; ++i) {   // every real slot, then this round's tree slots as tree_allowed says
    std::fill_n(allowed.data() + i * width, real, uint8_t{1});
    std::copy_n(tree_allowed + i * tree_width, tree_width, allowed.data() + i * width + real);
  }
  input_rows(s, w, h, ids, n, x.data(), residual.data());
  layer(s, w, cache, x.data(), residual.data(), n, positions.data(), tree_start, 0, allowed.data(), g, threads);
  lm_head(s, w, g, n, 1, logp, threads);
  log_softmax_rows(logp, n, s.draft_vocab);
  top_k_rows(logp, n, s.draft_vocab, w.d2t, top);
}

}  // namespace dart
