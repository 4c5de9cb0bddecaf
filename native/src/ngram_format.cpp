// Encoding and validation of the N-gram table header (layout in ngram_format.hpp).
#include "ngram_format.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "checksum.hpp"
#include "errors.hpp"

namespace dart {
namespace {

template <class T>
void put(uint8_t* base, size_t off, T v) { std::memcpy(base + off, &v, sizeof(T)); }

template <class T>
T get(const uint8_t* base, size_t off) {
  T v;
  std::memcpy(&v, base + off, sizeof(T));
  return v;
}

constexpr size_t kHeaderChecksumAt = 504;

}  // namespace

void compute_layout(TableHeader& h) {
  h.tokens_offset = kHeaderSize;
  h.counts_offset = align_up(h.tokens_offset + h.node_count * h.token_bytes);
  h.offsets_offset = align_up(h.counts_offset + h.node_count * h.count_bytes);
  h.meta_offset = align_up(h.offsets_offset + (h.internal_count + 1) * h.offset_bytes);
  h.file_size = h.meta_offset + h.meta_length;
}

void encode_header(const TableHeader& h, uint8_t out[kHeaderSize]) {
  std::memset(out, 0, kHeaderSize);
  std::memcpy(out, kMagic, 8);
  put<uint32_t>(out, 8, h.version);
  put<uint32_t>(out, 12, kHeaderSize);
  put<uint32_t>(out, 16, kEndianMarker);
  put<uint32_t>(out, 20, h.order);
  put<uint32_t>(out, 24, h.vocab_size);
  out[28] = h.token_bytes;
  out[29] = h.offset_bytes;
  out[30] = h.count_bytes;
  put<uint64_t>(out, 32, h.node_count);
  put<uint64_t>(out, 40, h.internal_count);
  put<uint64_t>(out, 48, h.total_tokens);
  put<uint32_t>(out, 56, h.min_count);
  for (uint32_t d = 0; d < kMaxOrder + 2; ++d) put<uint64_t>(out, 64 + 8 * d, h.level_start[d]);
  put<uint64_t>(out, 144, h.tokens_offset);
  put<uint64_t>(out, 152, h.counts_offset);
  put<uint64_t>(out, 160, h.offsets_offset);
  put<uint64_t>(out, 168, h.meta_offset);
  put<uint64_t>(out, 176, h.meta_length);
  put<uint64_t>(out, 184, h.file_size);
  put<uint64_t>(out, 192, h.body_checksum);
  std::memcpy(out + 200, h.fingerprint.data(), std::min(h.fingerprint.size(), kFingerprintBytes));
  put<uint64_t>(out, kHeaderChecksumAt, checksum_bytes(out, kHeaderChecksumAt));
}

TableHeader decode_header(const uint8_t* data, uint64_t actual_file_size) {
  if (actual_file_size < kHeaderSize) {
    throw FormatError("file is " + std::to_string(actual_file_size) +
                      " bytes, shorter than the 512-byte header: it is truncated or not an N-gram table");
  }
  if (std::memcmp(data, kMagic, 8) != 0) {
    throw FormatError("bad magic bytes: this is not a DART N-gram table (.dngram); an original DART "
                      ".trie must be converted with `python -m dart_core.ngram import`");
  }
  if (get<uint32_t>(data, 16) != kEndianMarker) {
    throw FormatError("byte-order marker mismatch: the table was written on a machine of the other endianness");
  }
  TableHeader h;
  h.version = get<uint32_t>(data, 8);
  if (h.version != kFormatVersion) {
    throw FormatError("format version " + std::to_string(h.version) + ", but this build of dart_core reads version " +
                      std::to_string(kFormatVersion));
  }
  if (get<uint64_t>(data, kHeaderChecksumAt) != checksum_bytes(data, kHeaderChecksumAt)) {
    throw FormatError("header checksum mismatch: the header is corrupted");
  }
  if (get<uint32_t>(data, 12) != kHeaderSize) throw FormatError("unexpected header size");
  h.order = get<uint32_t>(data, 20);
  h.vocab_size = get<uint32_t>(data, 24);
  h.token_bytes = data[28];
  h.offset_bytes = data[29];
  h.count_bytes = data[30];
  h.node_count = get<uint64_t>(data, 32);
  h.internal_count = get<uint64_t>(data, 40);
  h.total_tokens = get<uint64_t>(data, 48);
  h.min_count = get<uint32_t>(data, 56);
  for (uint32_t d = 0; d < kMaxOrder + 2; ++d) h.level_start[d] = get<uint64_t>(data, 64 + 8 * d);
  h.meta_length = get<uint64_t>(data, 176);
  h.body_checksum = get<uint64_t>(data, 192);
  const char* fp = reinterpret_cast<const char*>(data + 200);
  h.fingerprint.assign(fp, strnlen(fp, kFingerprintBytes));

  // Self-consistency: the widths, counts and layout must describe exactly this file.
  if (h.order < 1 || h.order > kMaxOrder) throw FormatError("order " + std::to_string(h.order) + " outside 1..8");
  if (h.vocab_size < 1) throw FormatError("vocab_size is 0");
  if (!(h.token_bytes == 2 || h.token_bytes == 4) || !(h.offset_bytes == 4 || h.offset_bytes == 8) ||
      h.count_bytes != 4) {
    throw FormatError("unsupported field widths in the header");
  }
  if (h.token_bytes == 2 && h.vocab_size > 65536) throw FormatError("2-byte tokens with vocab_size > 65536");
  const uint64_t max_nodes = actual_file_size;  // every node takes at least 6 bytes, so this bounds it loosely
  if (h.node_count < 1 || h.node_count > max_nodes || h.internal_count < 1 || h.internal_count > h.node_count) {
    throw FormatError("node counts in the header are inconsistent");
  }
  if (h.offset_bytes == 4 && h.node_count > 0xFFFFFFFFull) throw FormatError("4-byte offsets with > 2^32 nodes");
  if (h.level_start[0] != 0 || h.level_start[1] != 1 || h.level_start[h.order] != h.internal_count ||
      h.level_start[h.order + 1] != h.node_count) {
    throw FormatError("level boundaries in the header are inconsistent");
  }
  for (uint32_t d = 0; d <= h.order; ++d) {
    if (h.level_start[d] > h.level_start[d + 1]) throw FormatError("level boundaries are not increasing");
  }
  if (h.meta_length > actual_file_size) throw FormatError("metadata length exceeds the file");
  TableHeader expect = h;
  compute_layout(expect);
  if (get<uint64_t>(data, 144) != expect.tokens_offset || get<uint64_t>(data, 152) != expect.counts_offset ||
      get<uint64_t>(data, 160) != expect.offsets_offset || get<uint64_t>(data, 168) != expect.meta_offset) {
    throw FormatError("section offsets in the header are inconsistent");
  }
  h.tokens_offset = expect.tokens_offset;
  h.counts_offset = expect.counts_offset;
  h.offsets_offset = expect.offsets_offset;
  h.meta_offset = expect.meta_offset;
  h.file_size = get<uint64_t>(data, 184);
  if (h.file_size != expect.file_size) throw FormatError("file size recorded in the header is inconsistent");
  if (actual_file_size < h.file_size) {
    throw FormatError("file is truncated: " + std::to_string(actual_file_size) + " bytes on disk, the header says " +
                      std::to_string(h.file_size));
  }
  if (actual_file_size > h.file_size) {
    throw FormatError("file has " + std::to_string(actual_file_size - h.file_size) +
                      " unexpected trailing bytes");
  }
  return h;
}

}  // namespace dart
