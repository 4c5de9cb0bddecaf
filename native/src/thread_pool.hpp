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

}  // namespace dart
