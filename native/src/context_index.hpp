// ContextIndex: the live context of one request (its prompt and the tokens committed since) as counted
// n-grams, for DART's context candidates (docs/ARCHITECTURE.md section 5a).
//
// It answers the two questions the pruner asks of the corpus table, with the same back-off, about the text
// in front of the model instead of a training corpus: P(x | suffix) for a batch of candidates, and the
// continuations of the longest suffix seen before. It is extended as tokens are committed (O(max_order) hash
// updates a token) and never rebuilt; nothing the pruner drafts enters it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace dart {

class ContextIndex {
 public:
  // max_order: the longest context suffix counted (tokens before the continuation), >= 1.
  // vocab_size: ids must lie in [0, vocab_size) (the target's vocabulary; at most 2^32 - 1, as the table's).
  ContextIndex(size_t max_order, uint64_t vocab_size);

  void reset();
  // Append committed tokens; every id is checked first, so a bad one leaves the index as it was.
  void extend(const int64_t* tokens, size_t n);
  size_t size() const { return seq_.size(); }
  size_t max_order() const { return max_order_; }
  uint64_t vocab_size() const { return vocab_size_; }
  const std::vector<uint32_t>& tokens() const { return seq_; }

  // As NgramStore::query: for len = min(max_order, n_context) down to 1 the context suffix of that length is
  // looked up; each candidate not matched yet that followed it gets P = count(suffix + x) / count(suffix) and
  // matched = len. Never matched: P = 0, matched = 0.
  void query(const uint32_t* context, size_t n_context, const uint32_t* candidates, size_t n_candidates,
             double* probs, int32_t* matched) const;

  // What followed the longest suffix of `context` seen before: its length (0: none), how often it occurred,
  // and up to max_children continuation tokens, most frequent first (ties: most recent first).
  struct Continuations {
    int32_t matched = 0;
    uint32_t context_count = 0;
    std::vector<uint32_t> tokens;
    std::vector<uint32_t> counts;
  };
  Continuations continuations(const uint32_t* context, size_t n_context, size_t max_children) const;

 private:
  struct Child {
    uint32_t token;
    uint32_t count;
    uint64_t last;  // position of its latest occurrence
  };
  struct Entry {
    uint64_t end = 0;     // position right after the suffix's latest occurrence (where its continuation is)
    uint32_t total = 0;   // continuations counted
    std::vector<Child> children;
  };
  // The entry of the n tokens ending at context[n_context - 1], or null when never seen (a hash collision with
  // another n-gram reads as never seen: the stored occurrence is compared token by token).
  const Entry* find(const uint32_t* context, size_t n_context, size_t n) const;

  size_t max_order_;
  uint64_t vocab_size_;
  std::vector<uint32_t> seq_;
  std::vector<std::unordered_map<uint64_t, Entry>> maps_;  // maps_[n - 1]: suffixes of n tokens
};

}  // namespace dart
