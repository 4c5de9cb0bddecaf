// Streaming importer of the original DART .trie format (see trie_import.hpp).
#include "trie_import.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "errors.hpp"
#include "ngram_counter.hpp"
#include "ngram_runs.hpp"

namespace dart {
namespace {

// A zero-filled array of n elements backed by a temporary file (the OS pages it in and out),
// so per-node bookkeeping for a billion-node trie does not have to fit in RAM.
template <class T>
class FileBackedArray {
 public:
  FileBackedArray(const std::string& path, uint64_t n) : path_(path), bytes_(std::max<uint64_t>(n, 1) * sizeof(T)) {
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) throw IoError("cannot create " + path + ": " + std::strerror(errno));
    if (::ftruncate(fd, static_cast<off_t>(bytes_)) != 0) {
      ::close(fd);
      throw IoError("cannot size " + path + " (disk full?)");
    }
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) throw IoError("cannot mmap " + path);
    data_ = static_cast<T*>(p);
  }
  ~FileBackedArray() {
    ::munmap(data_, bytes_);
    std::remove(path_.c_str());
  }
  T& operator[](uint64_t i) { return data_[i]; }

 private:
  std::string path_;
  uint64_t bytes_;
  T* data_ = nullptr;
};

struct NodeRecord {
  int32_t token;
  uint64_t parent;
  int32_t freq;
  uint64_t n_children;
};

template <class Key>
BuildStats import_impl(BinaryReader& in, uint64_t file_size, uint64_t order, uint64_t node_count,
                       const std::string& src, const std::string& dst, uint32_t vocab_size,
                       const std::string& fingerprint, const std::string& metadata, uint32_t min_count,
                       const std::string& tmp_dir, uint64_t chunk_records,
                       const std::function<void(uint64_t, uint64_t)>& progress) {
  const uint32_t bits = bits_per_token(vocab_size);
  NgramCounter<Key> counter(static_cast<uint32_t>(order), vocab_size, tmp_dir, chunk_records);
  FileBackedArray<Key> keys(tmp_dir + "/import_keys.bin", node_count);
  FileBackedArray<uint8_t> depths(tmp_dir + "/import_depths.bin", node_count);
  auto bad = [&](uint64_t i, const std::string& what) {
    return FormatError(src + ": node " + std::to_string(i) + " of " + std::to_string(node_count) + ": " + what);
  };
  for (uint64_t i = 0; i < node_count; ++i) {
    NodeRecord r;
    if (!in.get(r.token) || !in.get(r.parent) || !in.get(r.freq) || !in.get(r.n_children)) {
      throw bad(i, "file ends early (truncated .trie)");
    }
    if (r.n_children > (file_size - in.consumed()) / 12) throw bad(i, "child count runs past the end of the file");
    for (uint64_t c = 0; c < r.n_children; ++c) {
      int32_t child_token;
      uint64_t child;
      if (!in.get(child_token) || !in.get(child)) throw bad(i, "file ends early (truncated .trie)");
      if (child <= i || child >= node_count) throw bad(i, "child id out of range");
    }
    if (r.freq < 0) throw bad(i, "negative frequency");
    if (i == 0) {  // the root: its freq is the number of counted positions
      counter.set_total_tokens(static_cast<uint64_t>(r.freq));
      keys[0] = 0;
      depths[0] = 0;
      continue;
    }
    if (r.parent >= i) throw bad(i, "parent " + std::to_string(r.parent) + " does not precede the node");
    if (r.token < 0 || static_cast<uint64_t>(r.token) >= vocab_size) {
      throw bad(i, "token id " + std::to_string(r.token) + " outside the vocabulary [0, " +
                       std::to_string(vocab_size) + "); pass the tokenizer the table was built with");
    }
    const uint32_t depth = depths[r.parent] + 1u;
    if (depth > order) throw bad(i, "deeper than the order " + std::to_string(order));
    const Key key = (keys[r.parent] << bits) | Key(static_cast<uint32_t>(r.token));
    keys[i] = key;
    depths[i] = static_cast<uint8_t>(depth);
    counter.add_count(depth, key, static_cast<uint64_t>(r.freq));
    if (progress && (i & 0xFFFFF) == 0) progress(in.consumed(), file_size);
  }
  uint8_t extra;
  if (in.get(extra)) throw FormatError(src + ": unexpected bytes after the last node");
  if (progress) progress(file_size, file_size);
  return counter.finish(dst, min_count, fingerprint, metadata);
}

}  // namespace

BuildStats import_original_trie(const std::string& src, const std::string& dst, uint32_t vocab_size,
                                const std::string& fingerprint, const std::string& metadata, uint32_t min_count,
                                const std::string& tmp_dir, uint64_t chunk_records,
                                const std::function<void(uint64_t, uint64_t)>& progress) {
  struct stat st;
  if (::stat(src.c_str(), &st) != 0) throw IoError("cannot open " + src + ": " + std::strerror(errno));
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  BinaryReader in(src);
  uint64_t order = 0, node_count = 0;
  if (!in.get(order) || !in.get(node_count)) throw FormatError(src + ": shorter than the 16-byte .trie header");
  if (order < 1 || order > kMaxOrder) {
    throw FormatError(src + ": order " + std::to_string(order) + " is not in 1..8");
  }
  // The smallest node record is 4 + 8 + 4 + 8 = 24 bytes.
  if (node_count < 1 || node_count > (file_size - 16) / 24) {
    throw FormatError(src + ": header claims " + std::to_string(node_count) + " nodes, which cannot fit in " +
                      std::to_string(file_size) + " bytes (truncated?)");
  }
  if (vocab_size < 1) throw std::invalid_argument("vocab_size must be positive");
  const uint64_t bits = uint64_t(bits_per_token(vocab_size)) * order;
  if (bits <= 64) {
    return import_impl<uint64_t>(in, file_size, order, node_count, src, dst, vocab_size, fingerprint, metadata,
                                 min_count, tmp_dir, chunk_records, progress);
  }
  if (bits <= 128) {
    return import_impl<unsigned __int128>(in, file_size, order, node_count, src, dst, vocab_size, fingerprint,
                                          metadata, min_count, tmp_dir, chunk_records, progress);
  }
  throw std::invalid_argument("order x bits per token exceeds 128 bits");
}

}  // namespace dart
