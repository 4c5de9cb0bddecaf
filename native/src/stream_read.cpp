// See stream_read.hpp.
#include "stream_read.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "gemm_kernels.hpp"
#include "small_gemm.hpp"
#include "thread_pool.hpp"

namespace dart {
namespace {
#ifdef DART_X86
__attribute__((target("avx2"))) uint64_t stream_read_avx2(const char* p, int64_t bytes) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  int64_t i = 0;
  for (; i + 128 <= bytes; i += 128) {
    a = _mm256_xor_si256(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_xor_si256(b, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    c = _mm256_xor_si256(c, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    d = _mm256_xor_si256(d, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  a = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), a);
  uint64_t s = lanes[0] ^ lanes[1] ^ lanes[2] ^ lanes[3];
  for (; i < bytes; ++i) s += static_cast<unsigned char>(p[i]);
  return s;
}
#endif
uint64_t stream_read_plain(const char* p, int64_t bytes) {
  uint64_t s = 0;
  int64_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    s ^= v;
  }
  for (; i < bytes; ++i) s += static_cast<unsigned char>(p[i]);
  return s;
}
}  // namespace

uint64_t stream_read(const void* p, int64_t bytes, int threads) {
  // Chunks of 256 KiB claimed in order by the GEMM's thread pool, as the GEMM's rows are: each thread streams
  // whole chunks of consecutive bytes.
  threads = std::max(1, threads);
  const char* base = static_cast<const char*>(p);
  int64_t chunk = 256 << 10;
  while ((bytes + chunk - 1) / chunk > 4096) chunk *= 2;
  const int64_t chunks = (bytes + chunk - 1) / chunk;
  std::vector<uint64_t> sums(static_cast<size_t>(chunks), 0);
  parallel_for_items(threads, chunks, [&](int64_t i) {
    const int64_t a = i * chunk, b = std::min<int64_t>(bytes, a + chunk);
#ifdef DART_X86
    if (small_gemm_has_avx2()) { sums[i] = stream_read_avx2(base + a, b - a); return; }
#endif
    sums[i] = stream_read_plain(base + a, b - a);
  });
  uint64_t s = 0;
  for (uint64_t v : sums) s ^= v;
  return s;
}

}  // namespace dart
