// The decoder layers of a Llama / Qwen2 / Qwen3 model on a CPU, for up to a few dozen positions
// per call: a plain decoding step, a draft tree, or one chunk of a prompt. At these sizes each
// torch op would cost more in dispatch than in arithmetic. One call runs a range of layers in
// place on the hidden states:
// RMSNorm, q/k/v projections (+ bias, + Qwen3's per-head q/k norm), RoPE, K/V written into
// the preallocated cache, masked softmax attention with grouped K/V heads, the output
// projection, and the SiLU-gated MLP, with float32 activations throughout. The projections
// run through small_gemm (weights float32 or bfloat16).
#pragma once

#include <cstdint>
#include <vector>

namespace dart {

struct DecoderShape {
  int64_t hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, intermediate = 0;
  float eps = 1e-6f;          // every RMSNorm of the model
  bool bf16_weights = false;  // projections' weights: bfloat16 bit patterns, else float32
};

// Borrowed pointers; the owner (the Python binding) keeps the arrays alive.
struct LayerWeights {
  const void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  const void *gate = nullptr, *up = nullptr, *down = nullptr;
  const float *q_bias = nullptr, *k_bias = nullptr, *v_bias = nullptr;      // Qwen2
  const float *in_norm = nullptr, *post_norm = nullptr;
  const float *q_norm = nullptr, *k_norm = nullptr;                          // Qwen3
};

// One layer's K/V buffers: [kv_heads, capacity, head_dim] each, float32.
struct LayerCache {
  float* keys = nullptr;
  float* values = nullptr;
};

// Runs layers [begin, end) on h [q, hidden] in place (q = 0: nothing to do); head_dim is even. The q new positions are start..start+q-1;
// cos/sin [q, head_dim] are their RoPE tables. allowed [q, start + q] (1 = may attend) or
// null for causal attention. capacity: slots per cache buffer (start + q <= capacity).
void decoder_layers(const DecoderShape& shape, const std::vector<LayerWeights>& layers,
                    const std::vector<LayerCache>& caches, int64_t capacity, int64_t begin, int64_t end, float* h,
                    int64_t q, const float* cos, const float* sin, const uint8_t* allowed, int64_t start,
                    int threads);

}  // namespace dart
