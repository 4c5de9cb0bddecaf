// Sorted run files of (n-gram key, count) records, and their k-way merge.
//
// The builder never holds all n-grams in memory: it counts a chunk of tokens, sorts the
// chunk's n-grams of each length, writes them as a "run" file, and at the end merges the
// runs of each length (summing equal keys). A key packs an n-gram's tokens into one
// integer, first token in the highest bits, so for n-grams of one length numeric order is
// lexicographic order, and the key of the (n-1)-gram prefix is key >> bits_per_token.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <queue>
#include <string>
#include <vector>

#include "errors.hpp"

namespace dart {

// Buffered binary writer of fixed-size records (also used for plain arrays).
class BinaryWriter {
 public:
  explicit BinaryWriter(const std::string& path) : path_(path) {
    f_ = std::fopen(path.c_str(), "wb");
    if (f_ == nullptr) throw IoError("cannot write " + path + ": " + std::strerror(errno));
    buf_.reserve(kBuf);
  }
  ~BinaryWriter() {
    if (f_ != nullptr) std::fclose(f_);
  }
  BinaryWriter(const BinaryWriter&) = delete;
  BinaryWriter& operator=(const BinaryWriter&) = delete;

  void write(const void* p, size_t n) {
    if (buf_.size() + n > kBuf) flush();
    const uint8_t* b = static_cast<const uint8_t*>(p);
    buf_.insert(buf_.end(), b, b + n);
    written_ += n;
  }
  template <class T>
  void put(const T& v) { write(&v, sizeof(T)); }
  void pad_to(uint64_t offset) {
    static const uint8_t zeros[64] = {};
    while (written_ < offset) write(zeros, std::min<uint64_t>(64, offset - written_));
  }
  uint64_t written() const { return written_; }
  void close() {
    flush();
    if (f_ != nullptr && std::fclose(f_) != 0) {
      f_ = nullptr;
      throw IoError("cannot finish writing " + path_ + " (disk full?)");
    }
    f_ = nullptr;
  }

 private:
  static constexpr size_t kBuf = 1 << 20;
  void flush() {
    if (!buf_.empty() && std::fwrite(buf_.data(), 1, buf_.size(), f_) != buf_.size()) {
      throw IoError("cannot write " + path_ + ": " + std::strerror(errno) + " (disk full?)");
    }
    buf_.clear();
  }
  std::string path_;
  std::FILE* f_ = nullptr;
  std::vector<uint8_t> buf_;
  uint64_t written_ = 0;
};

// Buffered sequential reader of fixed-size records.
class BinaryReader {
 public:
  explicit BinaryReader(const std::string& path) : path_(path) {
    f_ = std::fopen(path.c_str(), "rb");
    if (f_ == nullptr) throw IoError("cannot read " + path + ": " + std::strerror(errno));
    buf_.resize(kBuf);
  }
  ~BinaryReader() {
    if (f_ != nullptr) std::fclose(f_);
  }
  BinaryReader(const BinaryReader&) = delete;
  BinaryReader& operator=(const BinaryReader&) = delete;

  // Read exactly n bytes; false at a clean end of file, FormatError on a partial record.
  bool read(void* out, size_t n) {
    uint8_t* o = static_cast<uint8_t*>(out);
    size_t got = 0;
    while (got < n) {
      if (pos_ == len_) {
        len_ = std::fread(buf_.data(), 1, buf_.size(), f_);
        pos_ = 0;
        if (len_ == 0) {
          if (got == 0) return false;
          throw FormatError(path_ + " ends in the middle of a record (truncated)");
        }
      }
      size_t take = std::min(n - got, len_ - pos_);
      std::memcpy(o + got, buf_.data() + pos_, take);
      pos_ += take;
      got += take;
      consumed_ += take;
    }
    return true;
  }
  template <class T>
  bool get(T& v) { return read(&v, sizeof(T)); }
  uint64_t consumed() const { return consumed_; }

 private:
  static constexpr size_t kBuf = 1 << 20;
  std::string path_;
  std::FILE* f_ = nullptr;
  std::vector<uint8_t> buf_;
  size_t pos_ = 0, len_ = 0;
  uint64_t consumed_ = 0;
};

// One (key, count) record stream in key order.
template <class Key>
class RunReader {
 public:
  explicit RunReader(const std::string& path) : in_(path) {}
  bool next() { return in_.get(key) && in_.get(count); }
  Key key{};
  uint64_t count = 0;

 private:
  BinaryReader in_;
};

template <class Key>
void put_record(BinaryWriter& out, Key key, uint64_t count) {
  out.put(key);
  out.put(count);
}

// Merge sorted run files, calling emit(key, summed_count) once per distinct key, in order.
template <class Key, class Emit>
void merge_runs(const std::vector<std::string>& paths, Emit&& emit) {
  std::vector<std::unique_ptr<RunReader<Key>>> readers;
  using Item = std::pair<Key, size_t>;  // (key, reader index)
  auto greater = [](const Item& a, const Item& b) { return a.first > b.first || (a.first == b.first && a.second > b.second); };
  std::priority_queue<Item, std::vector<Item>, decltype(greater)> heap(greater);
  for (const auto& p : paths) {
    readers.emplace_back(new RunReader<Key>(p));
    if (readers.back()->next()) heap.emplace(readers.back()->key, readers.size() - 1);
  }
  bool have = false;
  Key cur{};
  uint64_t sum = 0;
  while (!heap.empty()) {
    auto [key, r] = heap.top();
    heap.pop();
    if (have && key == cur) {
      sum += readers[r]->count;
    } else {
      if (have) emit(cur, sum);
      cur = key;
      sum = readers[r]->count;
      have = true;
    }
    if (readers[r]->next()) heap.emplace(readers[r]->key, r);
  }
  if (have) emit(cur, sum);
}

}  // namespace dart
