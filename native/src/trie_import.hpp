// Streaming import of an original DART `.trie` (fvliang/DART TrieNgram::save) into our table.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "ngram_builder.hpp"

namespace dart {

// Original layout (native endianness, 64-bit size_t): size_t order, size_t node_count, then
// per node: int32 token, size_t parent, int32 freq, size_t n_children,
// n_children x (int32 token, size_t child). Node 0 is the root; a node's freq counts the
// occurrences of its n-gram. The file is read once, front to back: each node's n-gram key is
// its parent's key plus its token (parents are written before their children), kept in a
// file-backed temporary array, so the import needs no hash maps and little RAM even for a
// 43.5 GB original. `progress(bytes_read, total_bytes)` is called now and then.
BuildStats import_original_trie(const std::string& src, const std::string& dst, uint32_t vocab_size,
                                const std::string& fingerprint, const std::string& metadata, uint32_t min_count,
                                const std::string& tmp_dir, uint64_t chunk_records,
                                const std::function<void(uint64_t, uint64_t)>& progress);

}  // namespace dart
