// NgramStore: a read-only, memory-mapped DART N-gram table (layout in ngram_format.hpp).
//
// Opening maps the file, checks the header and indexes the root's children by token (O(1) in
// the table's size, O(vocab_size) for the index); `verify()` (also run by `open` when asked)
// checks the body checksum and the structure in O(file size). Every read a query
// makes is bounds-checked, so even an unverified corrupted file raises FormatError instead
// of reading outside the mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ngram_format.hpp"

namespace dart {

class NgramStore {
 public:
  // Map `path` and validate its header; with `verify`, also the checksum and structure.
  NgramStore(const std::string& path, bool verify);
  ~NgramStore();
  NgramStore(const NgramStore&) = delete;
  NgramStore& operator=(const NgramStore&) = delete;

  const TableHeader& header() const { return header_; }
  const std::string& path() const { return path_; }
  std::string metadata() const;

  // Full check: body checksum, offsets monotone and consistent with the levels, children
  // sorted. Throws FormatError naming the first problem.
  void verify() const;

  // The original DART back-off (docs/ARCHITECTURE.md section 6), for one context and a batch of
  // candidates: for len = min(order-1, n_context) down to 1, the context suffix of that
  // length is looked up; every candidate not matched yet that is a child of it gets
  // P = count(suffix + x) / count(suffix) and matched = len. Never-matched candidates
  // get P = 0, matched = 0. Token ids must already be checked against vocab_size.
  void query(const uint32_t* context, size_t n_context, const uint32_t* candidates, size_t n_candidates,
             double* probs, int32_t* matched) const;

  // Children of the longest context suffix present in the table: its matched length, its
  // count, and (token, count) of each child. For inspection (the `query` CLI).
  struct Continuations {
    int32_t matched = 0;
    uint64_t context_count = 0;
    std::vector<uint32_t> tokens;
    std::vector<uint64_t> counts;
  };
  Continuations continuations(const uint32_t* context, size_t n_context) const;

 private:
  // Typed views of the sections; selected by the header's widths.
  template <class Tok, class Off>
  void query_impl(const uint32_t* context, size_t n_context, const uint32_t* candidates, size_t n_candidates,
                  double* probs, int32_t* matched) const;
  template <class Tok, class Off>
  void verify_structure() const;
  template <class Tok>
  int64_t find_context(const uint32_t* context, size_t n) const;  // node index or -1
  uint64_t child_begin(uint64_t node) const;
  uint64_t child_end(uint64_t node) const;
  void children_range(uint64_t node, uint64_t& begin, uint64_t& end) const;
  uint32_t token_at(uint64_t node) const;
  uint32_t count_at(uint64_t node) const;

  void build_root_index();
  template <class Tok>
  uint64_t root_child(uint32_t token) const;   // the 1-gram's node, 0 when absent

  std::string path_;
  TableHeader header_;
  // root_child_[token] = node of the 1-gram `token`, 0 when absent: every query starts at the
  // root, whose children are the whole vocabulary, so one load replaces a bisection there. Empty for
  // vocabularies over kDenseRootTokens (64 MB of index), which bisect the 1-grams instead.
  static constexpr uint32_t kDenseRootTokens = 1u << 24;
  std::vector<uint32_t> root_child_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace dart
