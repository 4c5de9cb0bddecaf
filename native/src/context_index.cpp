// ContextIndex (context_index.hpp): hashed n-gram counts of one request's committed tokens.
#include "context_index.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace dart {
namespace {

// splitmix64's finaliser: a full-avalanche mix, so the suffix hashes of consecutive lengths are unrelated.
inline uint64_t mix(uint64_t h, uint32_t token) {
  uint64_t z = h + 0x9e3779b97f4a7c15ULL + (static_cast<uint64_t>(token) << 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

constexpr uint64_t kSeed = 0x2545f4914f6cdd1dULL;

}  // namespace

ContextIndex::ContextIndex(size_t max_order, uint64_t vocab_size)
    : max_order_(max_order), vocab_size_(vocab_size), maps_(max_order) {
  if (max_order < 1 || max_order > 64) throw std::invalid_argument("ContextIndex: max_order must be in [1, 64]");
  if (vocab_size < 1 || vocab_size > UINT32_MAX) {
    throw std::invalid_argument("ContextIndex: vocab_size must be in [1, 2^32 - 1]");
  }
}

void ContextIndex::reset() {
  seq_.clear();
  for (auto& m : maps_) m.clear();
}

void ContextIndex::extend(const int64_t* tokens, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || static_cast<uint64_t>(tokens[i]) >= vocab_size_) {
      throw std::invalid_argument("ContextIndex.extend: token id " + std::to_string(tokens[i]) +
                                  " at index " + std::to_string(i) + " is outside the vocabulary [0, " +
                                  std::to_string(vocab_size_) + ")");
    }
  }
  seq_.reserve(seq_.size() + n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t x = static_cast<uint32_t>(tokens[i]);
    const size_t pos = seq_.size();  // x's position; the suffixes counted end right before it
    uint64_t h = kSeed;
    for (size_t len = 1; len <= std::min(max_order_, pos); ++len) {
      h = mix(h, seq_[pos - len]);
      Entry& e = maps_[len - 1][h];
      if (e.total > 0 && !std::equal(seq_.begin() + (pos - len), seq_.begin() + pos,
                                     seq_.begin() + (e.end - len))) {
        continue;  // another n-gram with the same hash: left uncounted (reads as never seen)
      }
      e.end = pos;
      ++e.total;
      auto it = std::find_if(e.children.begin(), e.children.end(), [x](const Child& c) { return c.token == x; });
      if (it == e.children.end()) {
        e.children.push_back({x, 1, pos});
      } else {
        ++it->count;
        it->last = pos;
      }
    }
    seq_.push_back(x);
  }
}

const ContextIndex::Entry* ContextIndex::find(const uint32_t* context, size_t n_context, size_t n) const {
  uint64_t h = kSeed;
  for (size_t len = 1; len <= n; ++len) h = mix(h, context[n_context - len]);
  const auto& m = maps_[n - 1];
  auto it = m.find(h);
  if (it == m.end()) return nullptr;
  const Entry& e = it->second;
  if (!std::equal(context + (n_context - n), context + n_context, seq_.begin() + (e.end - n))) return nullptr;
  return &e;
}

void ContextIndex::query(const uint32_t* context, size_t n_context, const uint32_t* candidates,
                         size_t n_candidates, double* probs, int32_t* matched) const {
  std::fill(probs, probs + n_candidates, 0.0);
  std::fill(matched, matched + n_candidates, 0);
  size_t left = n_candidates;
  for (size_t len = std::min(max_order_, n_context); len >= 1 && left > 0; --len) {
    const Entry* e = find(context, n_context, len);
    if (e == nullptr) continue;
    for (size_t j = 0; j < n_candidates; ++j) {
      if (matched[j] != 0) continue;
      for (const Child& c : e->children) {
        if (c.token == candidates[j]) {
          probs[j] = static_cast<double>(c.count) / static_cast<double>(e->total);
          matched[j] = static_cast<int32_t>(len);
          --left;
          break;
        }
      }
    }
  }
}

ContextIndex::Continuations ContextIndex::continuations(const uint32_t* context, size_t n_context,
                                                         size_t max_children) const {
  Continuations out;
  for (size_t len = std::min(max_order_, n_context); len >= 1; --len) {
    const Entry* e = find(context, n_context, len);
    if (e == nullptr) continue;
    std::vector<const Child*> kids;
    kids.reserve(e->children.size());
    for (const Child& c : e->children) kids.push_back(&c);
    std::sort(kids.begin(), kids.end(), [](const Child* a, const Child* b) {
      return a->count != b->count ? a->count > b->count : a->last > b->last;
    });
    out.matched = static_cast<int32_t>(len);
    out.context_count = e->total;
    for (size_t i = 0; i < std::min(max_children, kids.size()); ++i) {
      out.tokens.push_back(kids[i]->token);
      out.counts.push_back(kids[i]->count);
    }
    break;
  }
  return out;
}

}  // namespace dart
