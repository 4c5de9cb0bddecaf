// The decoder's attention alone (native/src/decoder.cpp ops::attention), at the bundled target's shape: 30 layers
// of 9 query heads over 3 K/V heads, head_dim 64, a float32 cache holding `prefix` positions, `rows` new positions
// (1: a plain step; more: a tree, masked), `threads` threads. Before each timed pass it reads 300 MiB, as a step's
// weight stream would, so the K/V come from memory (NOFLUSH=1: from the caches, the arithmetic alone).
//
//   g++ -O2 -ffp-contract=off -std=c++17 -pthread -Inative/src benchmarks/native/attention_bench.cpp \
//       native/src/decoder.cpp native/src/small_gemm.cpp -o /tmp/attention_bench
//   /tmp/attention_bench 1 300 2        # rows prefix threads; prints the median and least ms of 55 passes
//
// A measurement, not a test; build it against an older decoder.cpp for a before arm.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "decoder.hpp"

int main(int argc, char** argv) {
  const int rows = argc > 1 ? std::atoi(argv[1]) : 1, prefix = argc > 2 ? std::atoi(argv[2]) : 300,
            threads = argc > 3 ? std::atoi(argv[3]) : 2;
  const int layers = 30, heads = 9, kv_heads = 3, D = 64, capacity = prefix + rows;
  dart::DecoderShape shape;
  shape.hidden = heads * D;
  shape.heads = heads;
  shape.kv_heads = kv_heads;
  shape.head_dim = D;
  std::mt19937 rng(0);
  std::normal_distribution<float> normal;
  std::vector<std::vector<float>> keys(layers), values(layers);
  for (int l = 0; l < layers; ++l) {
    keys[l].resize(static_cast<size_t>(kv_heads) * capacity * D);
    values[l].resize(keys[l].size());
    for (float& x : keys[l]) x = normal(rng);
    for (float& x : values[l]) x = normal(rng);
  }
  std::vector<float> qs(static_cast<size_t>(rows) * heads * D), out(qs.size());
  for (float& x : qs) x = 0.1f * normal(rng);
  std::vector<uint8_t> allowed(static_cast<size_t>(rows) * capacity, 1);   // a chain: node i sees nodes 0..i
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < rows; ++j) allowed[static_cast<size_t>(i) * capacity + prefix + j] = j <= i;
  std::vector<char> evict(std::getenv("NOFLUSH") ? 64 : (300 << 20), 1);
  std::vector<double> ms;
  volatile char sink = 0;
  for (int pass = 0; pass < 60; ++pass) {
    for (size_t i = 0; i < evict.size(); i += 64) sink = sink ^ evict[i];
    const auto t0 = std::chrono::steady_clock::now();
    for (int l = 0; l < layers; ++l)
      dart::ops::attention(shape, qs.data(), dart::LayerCache{keys[l].data(), values[l].data()}, capacity,
                           out.data(), rows, prefix, rows > 1 ? allowed.data() : nullptr, threads);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin() + 5, ms.end());
  std::printf("attention, %d rows after %d positions, %d threads: median %.3f ms, least %.3f ms\n", rows, prefix,
              threads, ms[5 + (ms.size() - 5) / 2], ms[5]);
  return 0;
}
