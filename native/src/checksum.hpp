// The 64-bit checksum of the N-gram table format.
//
// checksum(bytes) = n_bytes * GOLDEN + sum_i mix64(w_i ^ (i * GOLDEN))   (mod 2^64)
// where w_i is the i-th little-endian 8-byte word of the data (the last one zero-padded).
// mix64 (splitmix64's finaliser) is a bijection, so changing any single word changes the
// sum, and xoring in the word index makes swapped words count too. A sum of independent
// terms parallelises (OpenMP) and vectorises in numpy, so the pure-Python reference
// reader (dart_core/ngram/reference.py) recomputes exactly the same value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace dart {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

inline uint64_t checksum_bytes(const uint8_t* data, size_t n) {
  const size_t words = n / 8;
  uint64_t sum = 0;
#if defined(_OPENMP)
#pragma omp parallel for reduction(+ : sum) schedule(static) if (words > (1u << 22))
#endif
  for (long long i = 0; i < static_cast<long long>(words); ++i) {
    uint64_t w;
    std::memcpy(&w, data + 8 * static_cast<size_t>(i), 8);  // unaligned-safe, little-endian host
    sum += mix64(w ^ (static_cast<uint64_t>(i) * kGolden));
  }
  if (n % 8 != 0) {
    uint64_t w = 0;
    std::memcpy(&w, data + 8 * words, n % 8);
    sum += mix64(w ^ (static_cast<uint64_t>(words) * kGolden));
  }
  return sum + static_cast<uint64_t>(n) * kGolden;
}

}  // namespace dart
