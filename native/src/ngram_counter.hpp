// NgramCounter<Key>: the templated engine behind TableBuilder and the .trie importer.
//
// Counting: documents are appended to a chunk; when the chunk is full, for each length n
// the n-gram keys of every position are generated, sorted and run-length encoded into a
// run file (one file per length per chunk). Imported counts (add_count) are buffered per
// length and spilled the same way. finish() merges each length's runs in order 1..order,
// drops n-grams under min_count and n-grams whose prefix was dropped, counts each
// surviving prefix's children, and streams the table out level by level.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "checksum.hpp"
#include "errors.hpp"
#include "ngram_builder.hpp"
#include "ngram_format.hpp"
#include "ngram_runs.hpp"

#include <fcntl.h>
#include <unistd.h>

namespace dart {

template <class Key>
class NgramCounter final : public TableBuilder {
 public:
  NgramCounter(uint32_t order, uint32_t vocab_size, std::string tmp_dir, uint64_t chunk_tokens)
      : order_(order), vocab_size_(vocab_size), bits_(bits_per_token(vocab_size)), tmp_dir_(std::move(tmp_dir)),
        chunk_tokens_(std::max<uint64_t>(chunk_tokens, 1)), runs_(order + 1), pending_(order + 1) {
    if (order < 1 || order > kMaxOrder) throw std::invalid_argument("order must be in 1..8");
    if (static_cast<uint64_t>(bits_) * order > sizeof(Key) * 8) {
      throw std::invalid_argument("order x bits per token does not fit the key type");
    }
  }

  ~NgramCounter() override { remove_temp_files(); }

  void add_documents(const uint32_t* tokens, size_t n_tokens, const uint64_t* lengths, size_t n_docs) override {
    // All lengths first, summed without wrapping: a bad one must not leave half the documents added.
    uint64_t left = n_tokens;
    for (size_t d = 0; d < n_docs; ++d) {
      if (lengths[d] > left) throw std::invalid_argument("document lengths add up to more than the tokens given");
      left -= lengths[d];
    }
    if (left != 0) throw std::invalid_argument("document lengths do not sum to the number of tokens");
    for (size_t d = 0; d < n_docs; ++d) {
      const uint64_t n = lengths[d];
      chunk_.insert(chunk_.end(), tokens, tokens + n);
      doc_ends_.push_back(chunk_.size());
      tokens += n;
      total_tokens_ += n;
      if (chunk_.size() >= chunk_tokens_) spill_chunk();
    }
  }

  // Add `count` occurrences of the n-gram with packed key `key` and length `depth` (import).
  void add_count(uint32_t depth, Key key, uint64_t count) {
    pending_[depth].emplace_back(key, count);
    if (++pending_total_ >= chunk_tokens_) spill_pending();
  }

  void set_total_tokens(uint64_t total) { total_tokens_ = total; }
  uint64_t total_tokens() const override { return total_tokens_; }
  uint32_t vocab_size() const override { return vocab_size_; }

  BuildStats finish(const std::string& out_path, uint32_t min_count, const std::string& fingerprint,
                    const std::string& metadata) override {
    spill_chunk();
    spill_pending();
    min_count = std::max<uint32_t>(min_count, 1);
    BuildStats stats;
    stats.total_tokens = total_tokens_;
    stats.level_sizes.assign(order_ + 1, 0);
    stats.level_sizes[0] = 1;
    for (uint32_t n = 1; n <= order_; ++n) {
      stats.runs += static_cast<uint32_t>(runs_[n].size());
      stats.level_sizes[n] = merge_level(n, min_count);
    }
    write_table(out_path, stats, min_count, fingerprint, metadata);
    remove_temp_files();
    return stats;
  }

 private:
  Key mask() const { return (Key(1) << bits_) - 1; }
  std::string temp(const std::string& name) const { return tmp_dir_ + "/" + name; }
  std::string final_path(uint32_t n) const { return temp("level" + std::to_string(n) + ".keys"); }
  std::string children_path(uint32_t n) const { return temp("level" + std::to_string(n) + ".children"); }

  // Sort the chunk's n-grams of each length and write them as runs.
  void spill_chunk() {
    if (chunk_.empty()) return;
    std::vector<std::string> new_runs(order_ + 1);
    for (uint32_t n = 1; n <= order_; ++n) new_runs[n] = next_run_name(n);
    std::string error;
#if defined(_OPENMP)
#pragma omp parallel for schedule(dynamic, 1)
#endif
    for (int n = 1; n <= static_cast<int>(order_); ++n) {
      try {
        std::vector<Key> keys;
        keys.reserve(chunk_.size());
        uint64_t start = 0;
        for (uint64_t end : doc_ends_) {
          for (uint64_t p = start; p + n <= end; ++p) {
            Key k = 0;
            for (int i = 0; i < n; ++i) k = (k << bits_) | Key(chunk_[p + i]);
            keys.push_back(k);
          }
          start = end;
        }
        std::sort(keys.begin(), keys.end());
        BinaryWriter out(new_runs[n]);
        for (size_t i = 0; i < keys.size();) {
          size_t j = i + 1;
          while (j < keys.size() && keys[j] == keys[i]) ++j;
          put_record<Key>(out, keys[i], j - i);
          i = j;
        }
        out.close();
      } catch (const std::exception& e) {
#if defined(_OPENMP)
#pragma omp critical
#endif
        error = e.what();
      }
    }
    if (!error.empty()) throw IoError(error);
    for (uint32_t n = 1; n <= order_; ++n) runs_[n].push_back(new_runs[n]);
    chunk_.clear();
    doc_ends_.clear();
  }

  // Sort buffered imported counts of each length and write them as runs.
  void spill_pending() {
    for (uint32_t n = 1; n <= order_; ++n) {
      auto& v = pending_[n];
      if (v.empty()) continue;
      std::sort(v.begin(), v.end());
      std::string name = next_run_name(n);
      BinaryWriter out(name);
      for (size_t i = 0; i < v.size();) {
        size_t j = i;
        uint64_t sum = 0;
        while (j < v.size() && v[j].first == v[i].first) sum += v[j++].second;
        put_record<Key>(out, v[i].first, sum);
        i = j;
      }
      out.close();
      runs_[n].push_back(name);
      std::vector<std::pair<Key, uint64_t>>().swap(v);
    }
    pending_total_ = 0;
  }

  std::string next_run_name(uint32_t n) {
    return temp("level" + std::to_string(n) + "_run" + std::to_string(run_counter_++) + ".run");
  }

  // Merge the runs of length n into the final sorted key file; returns the nodes kept.
  // Alongside, writes how many children each kept (n-1)-gram has (its children file).
  uint64_t merge_level(uint32_t n, uint32_t min_count) {
    BinaryWriter keys_out(final_path(n));
    uint64_t kept = 0;
    if (n == 1) {
      merge_runs<Key>(runs_[n], [&](Key k, uint64_t c) {
        if (c < min_count) return;
        put_record<Key>(keys_out, k, c);
        ++kept;
      });
      keys_out.close();
      for (const auto& r : runs_[n]) std::remove(r.c_str());
      runs_[n].clear();
      root_children_ = kept;
      return kept;
    }
    // Walk the kept (n-1)-grams alongside: a child is kept only if its prefix was.
    RunReader<Key> parents(final_path(n - 1));
    BinaryWriter children_out(children_path(n - 1));
    bool parent_ok = parents.next();
    uint32_t children = 0;
    merge_runs<Key>(runs_[n], [&](Key k, uint64_t c) {
      if (c < min_count) return;
      const Key prefix = k >> bits_;
      while (parent_ok && parents.key < prefix) {
        children_out.put(children);
        children = 0;
        parent_ok = parents.next();
      }
      if (!parent_ok || parents.key != prefix) return;  // orphan: its prefix was pruned
      put_record<Key>(keys_out, k, c);
      ++children;
      ++kept;
    });
    while (parent_ok) {
      children_out.put(children);
      children = 0;
      parent_ok = parents.next();
    }
    keys_out.close();
    children_out.close();
    for (const auto& r : runs_[n]) std::remove(r.c_str());
    runs_[n].clear();
    return kept;
  }

  void write_table(const std::string& out_path, BuildStats& stats, uint32_t min_count,
                   const std::string& fingerprint, const std::string& metadata) {
    TableHeader h;
    h.order = order_;
    h.vocab_size = vocab_size_;
    h.token_bytes = vocab_size_ <= 65536 ? 2 : 4;
    h.count_bytes = 4;
    h.min_count = min_count;
    h.total_tokens = total_tokens_;
    h.node_count = 0;
    for (uint32_t d = 0; d <= order_; ++d) {
      h.level_start[d] = h.node_count;
      h.node_count += stats.level_sizes[d];
    }
    h.level_start[order_ + 1] = h.node_count;
    h.internal_count = h.level_start[order_];
    h.offset_bytes = h.node_count <= 0xFFFFFFFFull ? 4 : 8;
    h.meta_length = metadata.size();
    h.fingerprint = fingerprint.substr(0, kFingerprintBytes);
    compute_layout(h);

    const std::string tmp_out = out_path + ".tmp";
    {
      BinaryWriter out(tmp_out);
      uint8_t zeros[kHeaderSize] = {};
      out.write(zeros, kHeaderSize);  // the header is filled in once the checksum is known
      // tokens
      write_token(out, h.token_bytes, 0);
      for (uint32_t n = 1; n <= order_; ++n) {
        RunReader<Key> r(final_path(n));
        while (r.next()) write_token(out, h.token_bytes, static_cast<uint32_t>(r.key & mask()));
      }
      out.pad_to(h.counts_offset);
      // counts (saturated to 32 bits)
      out.put(saturate(total_tokens_));
      for (uint32_t n = 1; n <= order_; ++n) {
        RunReader<Key> r(final_path(n));
        while (r.next()) out.put(saturate(r.count));
      }
      out.pad_to(h.offsets_offset);
      // offsets: children of node i are [off[i], off[i+1])
      uint64_t off = 1;
      write_offset(out, h.offset_bytes, off);
      off += root_children_;
      write_offset(out, h.offset_bytes, off);
      for (uint32_t n = 1; n < order_; ++n) {
        BinaryReader r(children_path(n));
        uint32_t c;
        while (r.get(c)) {
          off += c;
          write_offset(out, h.offset_bytes, off);
        }
      }
      if (off != h.node_count) throw std::logic_error("internal error: child offsets do not add up");
      out.pad_to(h.meta_offset);
      out.write(metadata.data(), metadata.size());
      if (out.written() != h.file_size) throw std::logic_error("internal error: table size mismatch");
      out.close();
    }
    h.body_checksum = checksum_file_body(tmp_out, h.file_size);
    uint8_t header[kHeaderSize];
    encode_header(h, header);
    int fd = ::open(tmp_out.c_str(), O_WRONLY);
    if (fd < 0 || ::pwrite(fd, header, kHeaderSize, 0) != static_cast<ssize_t>(kHeaderSize) || ::fsync(fd) != 0) {
      if (fd >= 0) ::close(fd);
      throw IoError("cannot write the header of " + tmp_out);
    }
    ::close(fd);
    if (std::rename(tmp_out.c_str(), out_path.c_str()) != 0) throw IoError("cannot rename " + tmp_out + " to " + out_path);
    stats.node_count = h.node_count;
    stats.file_size = h.file_size;
  }

  static uint64_t checksum_file_body(const std::string& path, uint64_t size) {
    int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) throw IoError("cannot reopen " + path);
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) throw IoError("cannot mmap " + path);
    uint64_t sum = checksum_bytes(static_cast<const uint8_t*>(p) + kHeaderSize, size - kHeaderSize);
    ::munmap(p, size);
    return sum;
  }

  static uint32_t saturate(uint64_t c) {
    return c > std::numeric_limits<uint32_t>::max() ? std::numeric_limits<uint32_t>::max() : static_cast<uint32_t>(c);
  }
  static void write_token(BinaryWriter& out, uint8_t width, uint32_t t) {
    if (width == 2) out.put(static_cast<uint16_t>(t));
    else out.put(t);
  }
  static void write_offset(BinaryWriter& out, uint8_t width, uint64_t o) {
    if (width == 4) out.put(static_cast<uint32_t>(o));
    else out.put(o);
  }

  void remove_temp_files() {
    for (auto& level : runs_) {
      for (const auto& r : level) std::remove(r.c_str());
      level.clear();
    }
    for (uint32_t n = 1; n <= order_; ++n) {
      std::remove(final_path(n).c_str());
      std::remove(children_path(n).c_str());
    }
  }

  uint32_t order_, vocab_size_, bits_;
  std::string tmp_dir_;
  uint64_t chunk_tokens_;
  std::vector<uint32_t> chunk_;
  std::vector<uint64_t> doc_ends_;
  std::vector<std::vector<std::string>> runs_;                       // per length: run files
  std::vector<std::vector<std::pair<Key, uint64_t>>> pending_;       // per length: imported counts
  uint64_t pending_total_ = 0;
  uint64_t total_tokens_ = 0;
  uint64_t root_children_ = 0;
  uint64_t run_counter_ = 0;
};

}  // namespace dart
