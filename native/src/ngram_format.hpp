// On-disk layout of a DART N-gram table (".dngram"), version 1. One place defines it; the
// builder writes it, the store reads it and dart_core/ngram/reference.py mirrors it.
//
// All integers are little-endian. The file is:
//   [0, 512)            header (fields below; unused bytes are zero)
//   tokens   section    node_count x token_bytes    token of each node (root: 0)
//   counts   section    node_count x u32            occurrences of the node's n-gram (saturated)
//   offsets  section    (internal_count + 1) x offset_bytes
//                       children of node i are nodes [offsets[i], offsets[i+1]), sorted by token
//   metadata section    UTF-8 JSON written by the builder (sources, command, ...)
// Every section starts at a multiple of 64. Nodes are in breadth-first order: the root
// (node 0), then all 1-grams sorted by token, then all 2-grams sorted lexicographically, ...
// so the children of any node are contiguous and sorted, and the nodes of depth < order
// (the only ones that can have children, "internal") come first.
//
// Header fields (byte offset: type name):
//     0: char[8] magic "DARTNGRM"          8: u32 version            12: u32 header_size (512)
//    16: u32 endian marker 0x01020304      20: u32 order (1..8)      24: u32 vocab_size
//    28: u8 token_bytes (2|4)  29: u8 offset_bytes (4|8)  30: u8 count_bytes (4)  31: u8 0
//    32: u64 node_count        40: u64 internal_count     48: u64 total_tokens (true root count)
//    56: u32 min_count         60: u32 0
//    64: u64 level_start[10]   level_start[d] = index of the first node of depth d
//                              (d = 0..order), level_start[order + 1] = node_count
//   144: u64 tokens_offset    152: u64 counts_offset    160: u64 offsets_offset
//   168: u64 meta_offset      176: u64 meta_length      184: u64 file_size
//   192: u64 body_checksum    (checksum.hpp over bytes [512, file_size))
//   200: char[64] tokenizer fingerprint (ASCII, NUL-padded)
//   504: u64 header_checksum  (checksum.hpp over bytes [0, 504))
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dart {

constexpr char kMagic[8] = {'D', 'A', 'R', 'T', 'N', 'G', 'R', 'M'};
constexpr uint32_t kFormatVersion = 1;
constexpr uint32_t kHeaderSize = 512;
constexpr uint32_t kEndianMarker = 0x01020304u;
constexpr uint32_t kMaxOrder = 8;
constexpr size_t kFingerprintBytes = 64;
constexpr size_t kSectionAlign = 64;

// Decoded header. Offsets and sizes are in bytes, counts in nodes.
struct TableHeader {
  uint32_t version = kFormatVersion;
  uint32_t order = 0;
  uint32_t vocab_size = 0;
  uint8_t token_bytes = 4;
  uint8_t offset_bytes = 8;
  uint8_t count_bytes = 4;
  uint64_t node_count = 0;
  uint64_t internal_count = 0;
  uint64_t total_tokens = 0;
  uint32_t min_count = 1;
  uint64_t level_start[kMaxOrder + 2] = {};
  uint64_t tokens_offset = 0;
  uint64_t counts_offset = 0;
  uint64_t offsets_offset = 0;
  uint64_t meta_offset = 0;
  uint64_t meta_length = 0;
  uint64_t file_size = 0;
  uint64_t body_checksum = 0;
  std::string fingerprint;
};

// Round up to the section alignment.
inline uint64_t align_up(uint64_t x) { return (x + kSectionAlign - 1) / kSectionAlign * kSectionAlign; }

// Fill in the section offsets and file size from the counts and widths (used by the writer,
// and by the reader to check that a header is self-consistent).
void compute_layout(TableHeader& h);

// Serialise a header into 512 bytes, header checksum included.
void encode_header(const TableHeader& h, uint8_t out[kHeaderSize]);

// Parse and validate a header against the real size of the file; throws FormatError with a
// message naming what is wrong (bad magic, other version, truncated, inconsistent layout).
TableHeader decode_header(const uint8_t* data, uint64_t actual_file_size);

}  // namespace dart
