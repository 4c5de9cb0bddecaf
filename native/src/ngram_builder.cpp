// TableBuilder factory: picks the narrowest key type that holds order x bits-per-token.
#include "ngram_builder.hpp"

#include <stdexcept>

#include "ngram_counter.hpp"

namespace dart {

uint32_t bits_per_token(uint32_t vocab_size) {
  uint32_t bits = 1;
  while (bits < 32 && (uint64_t(1) << bits) < vocab_size) ++bits;
  return bits;
}

std::unique_ptr<TableBuilder> TableBuilder::create(uint32_t order, uint32_t vocab_size, const std::string& tmp_dir,
                                                   uint64_t chunk_tokens) {
  if (order < 1 || order > kMaxOrder) throw std::invalid_argument("order must be between 1 and 8");
  if (vocab_size < 1) throw std::invalid_argument("vocab_size must be positive");
  const uint64_t bits = uint64_t(bits_per_token(vocab_size)) * order;
  if (bits <= 64) return std::make_unique<NgramCounter<uint64_t>>(order, vocab_size, tmp_dir, chunk_tokens);
  if (bits <= 128) return std::make_unique<NgramCounter<unsigned __int128>>(order, vocab_size, tmp_dir, chunk_tokens);
  throw std::invalid_argument("order " + std::to_string(order) + " with a vocabulary of " + std::to_string(vocab_size) +
                              " ids needs more than 128 bits per n-gram; lower the order");
}

}  // namespace dart
