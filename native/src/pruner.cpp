// DART tree pruner. The arithmetic is written operation for operation like the pure-Python
// reference (dart_core/drafters/pruning.py) so both give bit-identical scores:
//   p       = softmax over the row's selected logits (double; max subtracted; summed in order)
//   lp      = min(0, log(p + eps))       lng = min(0, log(P_ng + eps))
//   logit_term = w_lvl * (w_logit * lp)  ngram_term = w_lvl * (w_ng * lng)   (0 at level 0)
//   score   = parent_score + (logit_term + ngram_term)
// With a live context (section 5a) its continuations join each expansion and both probabilities are mixed with
// the context's; an expansion the context has not seen (and context_weight 0) runs exactly the operations above.
// The min(0, .) clamp keeps every term <= 0 (the original gets this in float32 because
// 1 + 1e-10 rounds to 1), so a child never outscores its parent; with the total order
// (score desc, depth asc, insertion index asc) every kept node's parent is kept too.
#include "pruner.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>

namespace dart {
namespace {

void check_params(const PruneParams& p) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("PruningConfig." + what); };
  if (p.level_top_k < 1) fail("level_top_k must be >= 1");
  if (p.beam_width < 1) fail("beam_width must be >= 1");
  if (p.budget < 0) fail("budget must be >= 0");
  if (!std::isfinite(p.level_decay)) fail("level_decay must be finite");
  if (!(p.logit_decay >= 0) || !std::isfinite(p.logit_decay)) fail("logit_decay must be finite and >= 0");
  if (!(p.ngram_weight >= 0) || !std::isfinite(p.ngram_weight)) fail("ngram_weight must be finite and >= 0");
  if (!(p.eps > 0) || !std::isfinite(p.eps)) fail("eps must be finite and > 0");
  if (!(p.context_weight >= 0 && p.context_weight <= 1)) fail("context_weight must be in [0, 1]");
  if (p.context_top_k < 0) fail("context_top_k must be >= 0");
}

inline double clamped_log(double x, double eps) {
  const double v = std::log(x + eps);
  return v > 0.0 ? 0.0 : v;
}

}  // namespace

PruneResult prune_tree(const float* logits, const int64_t* tokens, size_t rows, size_t k, const int64_t* context,
                       size_t n_context, const NgramStore* store, const int64_t* eos, size_t n_eos,
                       const PruneParams& params, const ContextIndex* live) {
  check_params(params);
  if (n_context < 1) throw std::invalid_argument("context must hold at least the root token (its last element)");
  if (rows > 0 && k < 1) throw std::invalid_argument("topk_logits has no columns");
  const size_t kk = std::min<size_t>(k, static_cast<size_t>(params.level_top_k));
  const bool use_ngram = store != nullptr && params.ngram_weight != 0.0;

  // Per row: the kk best columns (stable: ties keep column order), their tokens and clamped
  // log-softmax terms.
  std::vector<uint32_t> sel_token(rows * kk);
  std::vector<double> sel_lp(rows * kk);
  std::vector<double> sel_p(rows * kk);   // the softmax itself, for the context's mixture (section 5a)
  std::vector<size_t> cols(k);
  std::vector<double> e(kk);
  for (size_t r = 0; r < rows; ++r) {
    const float* row = logits + r * k;
    for (size_t j = 0; j < k; ++j) {
      if (std::isnan(row[j]) || row[j] == INFINITY) {
        throw std::invalid_argument("topk_logits[" + std::to_string(r) + "] holds NaN or +inf");
      }
      // Selected tokens are kept as uint32 (the store's id type): refuse, never truncate, the rest.
      // dart_core/drafters/pruning.py checks the vocabulary first; this guards direct callers.
      const int64_t t = tokens[r * k + j];
      if (t < 0 || t > static_cast<int64_t>(UINT32_MAX)) {
        throw std::invalid_argument("topk_tokens holds token id " + std::to_string(t) +
                                    ", outside [0, 2^32): not a vocabulary id (check the drafter's id mapping)");
      }
    }
    std::iota(cols.begin(), cols.end(), size_t(0));
    std::stable_sort(cols.begin(), cols.end(), [row](size_t a, size_t b) { return row[a] > row[b]; });
    const double m = static_cast<double>(row[cols[0]]);
    if (m == -INFINITY) throw std::invalid_argument("topk_logits[" + std::to_string(r) + "] is all -inf");
    double s = 0.0;
    for (size_t j = 0; j < kk; ++j) {
      e[j] = std::exp(static_cast<double>(row[cols[j]]) - m);
      s += e[j];
    }
    for (size_t j = 0; j < kk; ++j) {
      sel_token[r * kk + j] = static_cast<uint32_t>(tokens[r * k + cols[j]]);
      sel_p[r * kk + j] = e[j] / s;
      sel_lp[r * kk + j] = clamped_log(sel_p[r * kk + j], params.eps);
    }
  }

  // Candidates this search can make: a beam never holds more than the level before it made, so a
  // huge beam_width must not size the reservation (it once asked for terabytes).
  size_t expect = 0;
  for (size_t l = 0, beam_size = 1; l < rows && expect < (size_t(1) << 20); ++l) {
    expect += beam_size * kk;
    beam_size = std::min<size_t>(beam_size * kk, static_cast<size_t>(params.beam_width));
  }
  expect = std::min<size_t>(expect, size_t(1) << 20);
  PruneResult out;
  for (auto* v : {&out.token, &out.parent, &out.depth, &out.node}) v->reserve(expect);
  for (auto* v : {&out.logit_term, &out.ngram_term, &out.score}) v->reserve(expect);
  out.kept.reserve(expect);
  out.source.reserve(expect);

  auto is_eos = [&](int64_t t) { return std::find(eos, eos + n_eos, t) != eos + n_eos; };

  // Context candidates: past the head's rows the tree goes on while the live context continues a path, at
  // most `budget` levels deep (a deeper node could never be kept).
  const bool use_live = live != nullptr && params.context_weight > 0.0 && params.context_top_k > 0;
  const size_t levels = use_live ? std::max(rows, static_cast<size_t>(params.budget)) : rows;
  // Query context: the last tokens of context ++ path(candidate), as many as either source reads.
  const size_t ctx_len = use_ngram ? std::max<uint32_t>(store->header().order, 2) - 1 : 0;
  const size_t live_len = use_live ? live->max_order() : 0;
  const size_t tail_len = std::max(ctx_len, live_len);
  std::vector<uint32_t> ctx_buf;
  std::vector<uint32_t> path;
  std::vector<uint32_t> cand_tok;   // one expansion's tokens: the row's columns, then context extras
  std::vector<double> cand_lp, cand_p;
  std::vector<double> probs, live_probs;
  std::vector<int32_t> matched, live_matched;

  std::vector<int64_t> beam{-1};        // candidate indices; -1 = the root
  std::vector<double> beam_score{0.0};
  std::vector<int64_t> level_ids;
  for (size_t l = 0; l < levels && !beam.empty(); ++l) {
    const double w_lvl = std::pow(static_cast<double>(l + 1), -params.level_decay);
    const double w_logit = std::pow(params.logit_decay, static_cast<double>(l));
    const bool head_row = l < rows;
    const bool ngram_here = use_ngram && l > 0;
    const size_t level_begin = out.token.size();
    for (size_t b = 0; b < beam.size(); ++b) {
      if (ngram_here || use_live) {
        path.clear();
        for (int64_t c = beam[b]; c >= 0; c = out.parent[c]) path.push_back(static_cast<uint32_t>(out.token[c]));
        ctx_buf.clear();
        const size_t from_path = std::min(path.size(), tail_len);
        const size_t from_ctx = std::min(n_context, tail_len - from_path);
        for (size_t i = n_context - from_ctx; i < n_context; ++i) ctx_buf.push_back(static_cast<uint32_t>(context[i]));
        for (size_t i = from_path; i > 0; --i) ctx_buf.push_back(path[i - 1]);  // path is leaf-first
      }
      cand_tok.clear();
      cand_lp.clear();
      cand_p.clear();
      if (head_row) {
        cand_tok.assign(sel_token.begin() + l * kk, sel_token.begin() + (l + 1) * kk);
        cand_lp.assign(sel_lp.begin() + l * kk, sel_lp.begin() + (l + 1) * kk);
        cand_p.assign(sel_p.begin() + l * kk, sel_p.begin() + (l + 1) * kk);
      }
      const size_t n_head = cand_tok.size();
      // lam: the context's share of both probabilities, by the length M of the longest suffix of this path the
      // context has seen before; a single repeated token (M = 1) is no evidence of copying
      double lam = 0.0;
      if (use_live) {  // the context's continuations the row does not hold already (duplicates merged)
        auto conts = live->continuations(ctx_buf.data(), ctx_buf.size(), static_cast<size_t>(params.context_top_k));
        if (conts.matched >= 2) lam = params.context_weight * (1.0 - std::ldexp(1.0, 1 - conts.matched));
        for (uint32_t t : conts.tokens) {
          if (lam > 0.0 && std::find(cand_tok.begin(), cand_tok.begin() + n_head, t) == cand_tok.begin() + n_head) {
            cand_tok.push_back(t);
            cand_lp.push_back(0.0);
            cand_p.push_back(0.0);  // the head did not rank it: its probability comes from the context alone
          }
        }
      }
      const size_t n_cand = cand_tok.size();
      if (n_cand == 0) continue;
      if (ngram_here) {
        probs.resize(n_cand);
        matched.resize(n_cand);
        const size_t n = std::min(ctx_buf.size(), ctx_len);
        store->query(ctx_buf.data() + (ctx_buf.size() - n), n, cand_tok.data(), n_cand, probs.data(), matched.data());
      }
      if (lam > 0.0) {
        live_probs.resize(n_cand);
        live_matched.resize(n_cand);
        live->query(ctx_buf.data(), ctx_buf.size(), cand_tok.data(), n_cand, live_probs.data(), live_matched.data());
      }
      for (size_t j = 0; j < n_cand; ++j) {
        double lt, nt = 0.0;
        uint8_t src = j < n_head ? kFromHead : 0;
        if (ngram_here && probs[j] > 0.0) src |= kFromCorpus;
        if (lam > 0.0) {
          // The context mixes into both of DART's probabilities with the one weight lam: the head's softmax (0 for
          // a token it did not rank) and the corpus table's (1, no information, at level 0 and without a table).
          const double pc = live_probs[j];
          const double p_corpus = ngram_here ? probs[j] : 1.0;
          lt = w_lvl * (w_logit * clamped_log((1.0 - lam) * cand_p[j] + lam * pc, params.eps));
          if (params.ngram_weight != 0.0) {
            nt = w_lvl * (params.ngram_weight * clamped_log((1.0 - lam) * p_corpus + lam * pc, params.eps));
          }
          if (pc > 0.0) src |= kFromContext;
        } else {
          lt = w_lvl * (w_logit * cand_lp[j]);
          if (ngram_here) nt = w_lvl * (params.ngram_weight * clamped_log(probs[j], params.eps));
        }
        out.token.push_back(cand_tok[j]);
        out.parent.push_back(beam[b]);
        out.depth.push_back(static_cast<int64_t>(l + 1));
        out.logit_term.push_back(lt);
        out.ngram_term.push_back(nt);
        out.score.push_back(beam_score[b] + (lt + nt));
        out.kept.push_back(0);
        out.source.push_back(src);
        out.node.push_back(-1);
      }
    }
    // Next beam: the best beam_width candidates of this level that do not end in EOS.
    level_ids.clear();
    for (size_t c = level_begin; c < out.token.size(); ++c) {
      if (!is_eos(out.token[c])) level_ids.push_back(static_cast<int64_t>(c));
    }
    const size_t width = std::min(level_ids.size(), static_cast<size_t>(params.beam_width));
    const auto& sc = out.score;
    std::partial_sort(level_ids.begin(), level_ids.begin() + width, level_ids.end(), [&sc](int64_t a, int64_t b) {
      return sc[a] > sc[b] || (sc[a] == sc[b] && a < b);
    });
    beam.assign(level_ids.begin(), level_ids.begin() + width);
    beam_score.resize(width);
    for (size_t i = 0; i < width; ++i) beam_score[i] = sc[beam[i]];
  }

  // Keep the best `budget` candidates by (score desc, depth asc, index asc).
  const size_t n = out.token.size();
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), int64_t(0));
  const size_t keep = std::min(n, static_cast<size_t>(params.budget));
  const auto& sc = out.score;
  const auto& dp = out.depth;
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int64_t a, int64_t b) {
    if (sc[a] != sc[b]) return sc[a] > sc[b];
    if (dp[a] != dp[b]) return dp[a] < dp[b];
    return a < b;
  });
  out.tree_tokens.assign(1, context[n_context - 1]);
  out.tree_parents.assign(1, -1);
  out.tree_depths.assign(1, 0);
  out.tree_scores.assign(1, 0.0);
  for (size_t r = 0; r < keep; ++r) {
    const int64_t c = order[r];
    out.kept[c] = 1;
    out.node[c] = static_cast<int64_t>(r + 1);
    const int64_t p = out.parent[c];
    const int64_t parent_node = p < 0 ? 0 : out.node[p];
    if (parent_node < 0) throw std::logic_error("internal error: a kept candidate's parent was pruned");
    out.tree_tokens.push_back(out.token[c]);
    out.tree_parents.push_back(parent_node);
    out.tree_depths.push_back(out.depth[c]);
    out.tree_scores.push_back(out.score[c]);
  }
  return out;
}

}  // namespace dart
