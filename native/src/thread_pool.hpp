// The process-wide thread pool of the small GEMM and the decoder's attention: one job at a time, items claimed in
// order, so a thread the OS has not scheduled yet never holds the others up.
#pragma once

#include <cstdint>

namespace dart {

// Runs fn(ctx, i) for every i in [0, total) on up to `threads` threads, the caller included, on a persistent
// pool (no OpenMP region per call). Items are claimed one at a time in increasing order, so a thread the OS has
// not scheduled yet never holds the others up: the caller does whatever nobody else took and waits only for items
// already started. fn must not depend on which thread runs an item. total < 65536. threads <= 1, total <= 1, or a
// pool busy with another caller's call: everything runs on the calling thread, in order.
void parallel_items(int threads, int64_t total, void (*fn)(void*, int64_t), void* ctx);
template <typename F>
void parallel_for_items(int threads, int64_t total, F&& f) {
  parallel_items(threads, total, [](void* c, int64_t i) { (*static_cast<F*>(c))(i); }, &f);
}

// Runs f(r0, r1) over row ranges covering [begin, end). From kParallelRows rows (a prompt chunk, a tree of 32+
// nodes) the ranges go to the pool's threads, up to four a thread, at least 8 rows each; fewer rows run as one range
// on the calling thread (a hand-off costs more than their per-row work). f must compute each row as it would alone.
constexpr int64_t kParallelRows = 32;
template <typename F>
void parallel_row_ranges(int threads, int64_t begin, int64_t end, F&& f) {
  const int64_t q = end - begin;
  if (threads <= 1 || q < kParallelRows) return f(begin, end);
  const int64_t parts = q / 8 < 4 * static_cast<int64_t>(threads) ? q / 8 : 4 * static_cast<int64_t>(threads);
  parallel_for_items(threads, parts, [&](int64_t i) { f(begin + q * i / parts, begin + q * (i + 1) / parts); });
}

}  // namespace dart
