// The read-bandwidth probe of benchmarks/tree_cost.py --bandwidth: the memory floor a decoding step is measured
// against, read through the same thread pool as the small GEMM.
#pragma once

#include <cstdint>

namespace dart {

// Benchmarks (benchmarks/tree_cost.py --bandwidth). Reads `bytes` bytes at p once with `threads` threads, each a
// contiguous range, 64 bytes per load; returns a checksum (so the reads are not optimised away).
uint64_t stream_read(const void* p, int64_t bytes, int threads);

}  // namespace dart
