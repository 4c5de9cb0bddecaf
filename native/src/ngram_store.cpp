// Memory-mapped N-gram table: open, verify and the back-off query.
#include "ngram_store.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cerrno>
#include <cstring>

#include "checksum.hpp"
#include "errors.hpp"

namespace dart {
namespace {

// Position of `token` in the sorted range [first, last), or `last` when absent. Short
// ranges (most contexts have a handful of children) are scanned; long ones are bisected
// without branches on the data (conditional moves), which avoids the mispredictions that
// dominate a plain binary search over random candidates.
template <class Tok>
const Tok* find_token(const Tok* first, const Tok* last, uint32_t token) {
  size_t n = static_cast<size_t>(last - first);
  if (n <= 8) {
    for (const Tok* p = first; p != last; ++p) {
      if (*p == token) return p;
    }
    return last;
  }
  const Tok* base = first;
  while (n > 1) {
    const size_t half = n / 2;
    base = (static_cast<uint32_t>(base[half]) <= token) ? base + half : base;
    n -= half;
  }
  return (static_cast<uint32_t>(*base) == token) ? base : last;
}

[[noreturn]] void corrupted(const std::string& what) {
  throw FormatError("corrupted table body (" + what + "); run `python -m dart_core.ngram info --verify` on it");
}

}  // namespace

NgramStore::NgramStore(const std::string& path, bool verify_body) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError("cannot open " + path + ": " + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw IoError("cannot stat " + path + ": " + std::strerror(err));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ < kHeaderSize) {
    ::close(fd);
    header_ = decode_header(nullptr, size_);  // throws the "shorter than the header" error
  }
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw IoError("cannot mmap " + path + ": " + std::strerror(errno));
  data_ = static_cast<const uint8_t*>(p);
  try {
    header_ = decode_header(data_, size_);
    if (verify_body) verify();
    build_root_index();
  } catch (...) {
    ::munmap(const_cast<uint8_t*>(data_), size_);
    data_ = nullptr;
    throw;
  }
}

NgramStore::~NgramStore() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

void NgramStore::build_root_index() {
  // O(vocab_size), independent of the table's size; the 1-grams are nodes [1, level_start[2]). Past
  // kDenseRootTokens the index would outweigh any table (2^32 - 1 tokens: 17 GB): root_child() bisects instead.
  root_child_.clear();
  if (header_.vocab_size > kDenseRootTokens) return;
  root_child_.assign(header_.vocab_size, 0);
  const uint64_t first = header_.level_start[1], last = header_.level_start[2];
  if (last > 0xFFFFFFFFull) return;  // cannot happen: at most vocab_size 1-grams; keep reads in range
  for (uint64_t i = first; i < last; ++i) {
    const uint32_t t = token_at(i);
    if (t < header_.vocab_size) root_child_[t] = static_cast<uint32_t>(i);
  }
}

std::string NgramStore::metadata() const {
  return std::string(reinterpret_cast<const char*>(data_ + header_.meta_offset), header_.meta_length);
}

template <class Tok>
uint64_t NgramStore::root_child(uint32_t token) const {
  if (!root_child_.empty()) return root_child_[token];
  const Tok* tokens = reinterpret_cast<const Tok*>(data_ + header_.tokens_offset);
  const uint64_t first = header_.level_start[1], last = header_.level_start[2];
  const Tok* hit = find_token(tokens + first, tokens + last, token);
  return hit == tokens + last ? 0 : static_cast<uint64_t>(hit - tokens);
}

uint32_t NgramStore::token_at(uint64_t node) const {
  if (header_.token_bytes == 2) return reinterpret_cast<const uint16_t*>(data_ + header_.tokens_offset)[node];
  return reinterpret_cast<const uint32_t*>(data_ + header_.tokens_offset)[node];
}

uint32_t NgramStore::count_at(uint64_t node) const {
  return reinterpret_cast<const uint32_t*>(data_ + header_.counts_offset)[node];
}

uint64_t NgramStore::child_begin(uint64_t node) const {
  if (header_.offset_bytes == 4) return reinterpret_cast<const uint32_t*>(data_ + header_.offsets_offset)[node];
  return reinterpret_cast<const uint64_t*>(data_ + header_.offsets_offset)[node];
}

uint64_t NgramStore::child_end(uint64_t node) const { return child_begin(node + 1); }

void NgramStore::children_range(uint64_t node, uint64_t& begin, uint64_t& end) const {
  if (node >= header_.internal_count) {  // depth == order: a leaf by construction
    begin = end = 0;
    return;
  }
  begin = child_begin(node);
  end = child_end(node);
  if (begin > end || end > header_.node_count || begin < 1) corrupted("child offsets out of range");
}

void NgramStore::verify() const {
  const TableHeader& h = header_;
  if (checksum_bytes(data_ + kHeaderSize, size_ - kHeaderSize) != h.body_checksum) {
    throw FormatError("body checksum mismatch: the file is corrupted (a flipped or overwritten byte)");
  }
  // The checksum matched, so the bytes are as written; still check the structure, which
  // guards against a buggy writer and keeps every later read in bounds.
  const bool t16 = h.token_bytes == 2, o32 = h.offset_bytes == 4;
  if (t16 && o32) verify_structure<uint16_t, uint32_t>();
  else if (t16) verify_structure<uint16_t, uint64_t>();
  else if (o32) verify_structure<uint32_t, uint32_t>();
  else verify_structure<uint32_t, uint64_t>();
}

template <class Tok, class Off>
void NgramStore::verify_structure() const {
  const TableHeader& h = header_;
  const Tok* tokens = reinterpret_cast<const Tok*>(data_ + h.tokens_offset);
  const Off* offs = reinterpret_cast<const Off*>(data_ + h.offsets_offset);
  if (offs[0] != 1 || offs[h.internal_count] != h.node_count) {
    throw FormatError("child offsets do not cover the nodes exactly");
  }
  for (uint32_t depth = 0; depth < h.order; ++depth) {
    // Children of the nodes of this depth must be exactly the nodes of the next depth.
    const uint64_t first = h.level_start[depth], last = h.level_start[depth + 1];
    if (offs[first] != h.level_start[depth + 1] || offs[last] != h.level_start[depth + 2]) {
      throw FormatError("children of depth " + std::to_string(depth) + " are not the nodes of depth " +
                        std::to_string(depth + 1));
    }
    for (uint64_t i = first; i < last; ++i) {
      const uint64_t b = offs[i], e = offs[i + 1];
      if (b > e) throw FormatError("child offsets are not increasing at node " + std::to_string(i));
      for (uint64_t c = b + 1; c < e; ++c) {
        if (tokens[c] <= tokens[c - 1]) {
          throw FormatError("children of node " + std::to_string(i) + " are not sorted by token");
        }
      }
      if (e > b && tokens[e - 1] >= h.vocab_size) {
        throw FormatError("token id out of vocabulary at node " + std::to_string(e - 1));
      }
    }
  }
}

template <class Tok>
int64_t NgramStore::find_context(const uint32_t* context, size_t n) const {
  const Tok* tokens = reinterpret_cast<const Tok*>(data_ + header_.tokens_offset);
  if (n == 0) return 0;
  uint64_t node = root_child<Tok>(context[0]);  // ids were range-checked by the caller
  if (node == 0) return -1;
  for (size_t i = 1; i < n; ++i) {
    uint64_t b, e;
    children_range(node, b, e);
    const Tok* hit = find_token(tokens + b, tokens + e, context[i]);
    if (hit == tokens + e) return -1;
    node = static_cast<uint64_t>(hit - tokens);
  }
  return static_cast<int64_t>(node);
}

template <class Tok, class Off>
void NgramStore::query_impl(const uint32_t* context, size_t n_context, const uint32_t* candidates,
                            size_t n_candidates, double* probs, int32_t* matched) const {
  const Tok* tokens = reinterpret_cast<const Tok*>(data_ + header_.tokens_offset);
  const uint32_t* counts = reinterpret_cast<const uint32_t*>(data_ + header_.counts_offset);
  const Off* offs = reinterpret_cast<const Off*>(data_ + header_.offsets_offset);
  const uint64_t internal = header_.internal_count, nodes = header_.node_count;
  auto range = [&](uint64_t node, uint64_t& b, uint64_t& e) {
    if (node >= internal) {
      b = e = 0;
      return;
    }
    b = offs[node];
    e = offs[node + 1];
    if (b > e || e > nodes || b < 1) corrupted("child offsets out of range");
  };
  std::fill(probs, probs + n_candidates, 0.0);
  std::fill(matched, matched + n_candidates, 0);
  const size_t longest = std::min<size_t>(header_.order - 1, n_context);
  if (longest == 0 || n_candidates == 0) return;

  // Find the node of every context suffix (lengths longest..1). The walks are independent, so
  // they advance in lockstep: their cache misses overlap instead of queueing one after another.
  // node[len] = node of the last `len` context tokens, 0 = absent (0 is the root, never a suffix).
  uint64_t node[kMaxOrder + 1] = {};
  const uint32_t* tail = context + n_context;
  for (size_t len = longest; len > 0; --len) node[len] = root_child<Tok>(tail[-static_cast<ptrdiff_t>(len)]);
  for (size_t step = 1; step < longest; ++step) {
    for (size_t len = longest; len > step; --len) {
      if (node[len] == 0) continue;
      uint64_t b, e;
      range(node[len], b, e);
      const Tok* hit = find_token(tokens + b, tokens + e, tail[step - static_cast<ptrdiff_t>(len)]);
      node[len] = hit == tokens + e ? 0 : static_cast<uint64_t>(hit - tokens);
    }
  }
  for (size_t len = longest; len > 0; --len) {
    if (node[len] != 0) {
      __builtin_prefetch(counts + node[len]);
      __builtin_prefetch(offs + node[len]);
    }
  }

  // Back off: each candidate takes the longest suffix it continues.
  size_t remaining = n_candidates;
  for (size_t len = longest; len > 0 && remaining > 0; --len) {
    if (node[len] == 0) continue;  // this suffix never occurred: back off to a shorter one
    const uint32_t ctx_count = counts[node[len]];
    if (ctx_count == 0) continue;
    uint64_t b, e;
    range(node[len], b, e);
    if (b == e) continue;
    const double denom = static_cast<double>(ctx_count);
    for (size_t i = 0; i < n_candidates; ++i) {
      if (matched[i] != 0) continue;
      const Tok* hit = find_token(tokens + b, tokens + e, candidates[i]);
      if (hit == tokens + e) continue;
      probs[i] = static_cast<double>(counts[hit - tokens]) / denom;
      matched[i] = static_cast<int32_t>(len);
      --remaining;
    }
  }
}

void NgramStore::query(const uint32_t* context, size_t n_context, const uint32_t* candidates, size_t n_candidates,
                       double* probs, int32_t* matched) const {
  const bool t16 = header_.token_bytes == 2, o32 = header_.offset_bytes == 4;
  if (t16 && o32) query_impl<uint16_t, uint32_t>(context, n_context, candidates, n_candidates, probs, matched);
  else if (t16) query_impl<uint16_t, uint64_t>(context, n_context, candidates, n_candidates, probs, matched);
  else if (o32) query_impl<uint32_t, uint32_t>(context, n_context, candidates, n_candidates, probs, matched);
  else query_impl<uint32_t, uint64_t>(context, n_context, candidates, n_candidates, probs, matched);
}

NgramStore::Continuations NgramStore::continuations(const uint32_t* context, size_t n_context) const {
  Continuations out;
  const size_t longest = std::min<size_t>(header_.order - 1, n_context);
  for (size_t len = longest; len > 0; --len) {
    int64_t ctx;
    if (header_.token_bytes == 2) ctx = find_context<uint16_t>(context + n_context - len, len);
    else ctx = find_context<uint32_t>(context + n_context - len, len);
    if (ctx < 0) continue;
    uint64_t b, e;
    children_range(static_cast<uint64_t>(ctx), b, e);
    if (b == e || count_at(static_cast<uint64_t>(ctx)) == 0) continue;  // as in query(): back off
    out.matched = static_cast<int32_t>(len);
    out.context_count = count_at(static_cast<uint64_t>(ctx));
    for (uint64_t c = b; c < e; ++c) {
      out.tokens.push_back(token_at(c));
      out.counts.push_back(count_at(c));
    }
    return out;
  }
  return out;
}

}  // namespace dart
