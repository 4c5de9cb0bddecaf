// Building a DART N-gram table from token-id documents (or from imported counts) with
// bounded memory: count n-grams chunk by chunk into sorted run files, then merge the runs
// and write the breadth-first table (ngram_format.hpp) in one streaming pass.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dart {

// What a finished build produced.
struct BuildStats {
  uint64_t node_count = 0;
  uint64_t file_size = 0;
  uint64_t total_tokens = 0;
  std::vector<uint64_t> level_sizes;  // nodes per depth, root included (level_sizes[0] == 1)
  uint32_t runs = 0;                  // sorted run files merged
};

// Type-erased front of the templated counter (the key width depends on order x vocab).
class TableBuilder {
 public:
  virtual ~TableBuilder() = default;

  // Count all n-grams (n = 1..order) of `n_docs` documents laid end to end in `tokens`;
  // n-grams never cross a document boundary. Ids must be < vocab_size (checked by caller); the
  // lengths must sum to n_tokens (std::invalid_argument, and nothing added, when they do not).
  virtual void add_documents(const uint32_t* tokens, size_t n_tokens, const uint64_t* lengths, size_t n_docs) = 0;

  // Merge, prune n-grams seen fewer than `min_count` times (with their continuations), and
  // write the table to `out_path` atomically (written to out_path + ".tmp", then renamed).
  virtual BuildStats finish(const std::string& out_path, uint32_t min_count, const std::string& fingerprint,
                            const std::string& metadata) = 0;

  // Tokens added so far.
  virtual uint64_t total_tokens() const = 0;

  // Ids must be below this (they are packed into bits_per_token(vocab_size) bits).
  virtual uint32_t vocab_size() const = 0;

  // A builder for tables of `order` over ids < vocab_size; temporary run files go to
  // `tmp_dir` (must exist, the caller removes it); a chunk holds `chunk_tokens` tokens
  // before it is sorted and spilled (peak memory about order x chunk_tokens x 16 bytes).
  static std::unique_ptr<TableBuilder> create(uint32_t order, uint32_t vocab_size, const std::string& tmp_dir,
                                              uint64_t chunk_tokens);
};

// Bits needed per token id of a vocabulary of `vocab_size` ids.
uint32_t bits_per_token(uint32_t vocab_size);

}  // namespace dart
