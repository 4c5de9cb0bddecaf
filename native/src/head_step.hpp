// One drafting forward of a draft head (DART or EAGLE-3) on a CPU, in one call: the head's
// inputs (fc over the target's features, the target's token embedding, the norms, DART's mask
// slots), its one decoder layer with K/V in the head's cache, the final norm(s), the
// draft-vocabulary LM head and each row's top-k mapped to target ids. The torch heads
// (dart_core/models/heads) are the reference; the arithmetic is theirs in float32 activations
// (bf16 weights are widened exactly), reusing the target decoder's pieces (decoder.hpp ops).
//
// Only the rows a caller reads go through attention, o_proj, the MLP and the LM head (DART: the
// last real row and the mask slots; EAGLE-3's real step: its last row); the other rows only
// write their K/V, as in the torch heads, where those rows' outputs are dropped.
#pragma once

#include <cstdint>

#include "decoder.hpp"

namespace dart {

struct HeadShape {
  int64_t hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, intermediate = 0;
  int64_t fc_in = 0;        // 3 x the target's hidden size
  int64_t draft_vocab = 0;  // rows of lm_head
  int64_t vocab = 0;        // rows of the target's embedding
  float eps = 1e-6f;
  bool bf16_weights = false;  // fc, projections and lm_head: bfloat16 bit patterns, else float32
  bool bf16_embed = false;    // the target's embedding: bfloat16 bit patterns, else float32
};

// Borrowed pointers; the owner (the Python binding) keeps the arrays alive.
struct HeadWeights {
  const void *fc = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  const void *gate = nullptr, *up = nullptr, *down = nullptr, *lm_head = nullptr;
  const float *hidden_norm = nullptr, *input_norm = nullptr, *post_norm = nullptr, *norm = nullptr;
  const float* mask_rep = nullptr;  // [2 * hidden], DART only
  const float* inv_freq = nullptr;  // [head_dim / 2] RoPE frequencies
  const void* embed = nullptr;      // [vocab, hidden]
  const int64_t* d2t = nullptr;     // [draft_vocab]: target id = draft id + d2t[draft id]
};

// The head's K/V buffers, [kv_heads, capacity, head_dim] float32 each.
struct HeadCacheView {
  float* keys = nullptr;
  float* values = nullptr;
  int64_t capacity = 0;
};

// Each row's best top_k draft ids by value (ties to the lower id) as target ids, and their values.
struct TopK {
  float* values = nullptr;   // [rows, top_k]
  int64_t* tokens = nullptr;  // [rows, top_k]
  int64_t top_k = 0;
};

// DART: n real positions (features aux [n, fc_in], next_ids [n]: the token after each) and levels - 1
// mask slots at positions start.., K/V written to cache slots start..start+n+levels-2 (the caller counts
// only the n real ones as kept). Rows n-1.. (levels rows: tree levels 0..levels-1) give logits
// lm_head(norm(norm(h))) into logits [levels, draft_vocab] (caller-owned scratch) and their top-k.
void dart_head_step(const HeadShape& s, const HeadWeights& w, const HeadCacheView& cache, const float* aux,
                    const int64_t* next_ids, int64_t n, int64_t start, int64_t levels, float* logits, const TopK& top,
                    int threads);

// EAGLE-3, the real step: n committed positions (aux [n, fc_in], next_ids [n]) at start.., causal; the
// last row's g [hidden] (fed back as the tree's h), its log-softmax logits (logp [draft_vocab], scratch)
// and their top-k.
void eagle3_real_step(const HeadShape& s, const HeadWeights& w, const HeadCacheView& cache, const float* aux,
                      const int64_t* next_ids, int64_t n, int64_t start, float* g, float* logp, const TopK& top,
                      int threads);

// EAGLE-3, one tree depth: n frontier nodes (h [n, hidden] their parents' g, ids [n]) all at RoPE
// position `position`, K/V at slots tree_start..; each sees every real slot [0, real) and the tree slots
// [real, tree_start + n) marked in tree_allowed [n, tree_start - real + n]. g [n, hidden], logp [n,
// draft_vocab] (log-softmax), top-k per row.
void eagle3_tree_step(const HeadShape& s, const HeadWeights& w, const HeadCacheView& cache, const float* h,
                      const int64_t* ids, int64_t n, int64_t position, int64_t real, int64_t tree_start,
                      const uint8_t* tree_allowed, float* g, float* logp, const TopK& top, int threads);

}  // namespace dart
