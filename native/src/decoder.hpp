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
  // q, k and v (gate and up) lie back to back in memory, as one matrix [qd + 2 kvd, hidden] ([2 I, hidden]): the
  // decoder then runs each group as one GEMM call (fused_projections sets these; the same products either way).
  bool qkv_adjacent = false, gate_up_adjacent = false;
};

// Marks w's projection groups that lie back to back (see LayerWeights), for weights of `elem` bytes each.
void fused_projections(const DecoderShape& s, LayerWeights* w, int64_t elem);

// One layer's K/V buffers: [kv_heads, capacity, head_dim] each, float32.
struct LayerCache {
  float* keys = nullptr;
  float* values = nullptr;
};

// Runs layers [begin, end) on h [q, hidden] in place (q = 0: nothing to do); head_dim is even. The q new positions are start..start+q-1;
// cos/sin [q, head_dim] are their RoPE tables. allowed [q, start + q] (1 = may attend) or
// null for causal attention. capacity: slots per cache buffer (start + q <= capacity).
// tail_from (0..q): in layer end - 1, rows [0, tail_from) stop once their K/V are in the cache: their hidden states
// stay as they entered that layer, for a caller that reads only the last rows (a prompt's last chunk) or none (its
// inner chunks). The rows that run are the same bits either way.
void decoder_layers(const DecoderShape& shape, const std::vector<LayerWeights>& layers,
                    const std::vector<LayerCache>& caches, int64_t capacity, int64_t begin, int64_t end, float* h,
                    int64_t q, const float* cos, const float* sin, const uint8_t* allowed, int64_t start,
                    int threads, int64_t tail_from = 0);

// The pieces of a layer, for the draft heads' native step (head_step.cpp): the same arithmetic as above.
namespace ops {
// y [M, N] = x [M, K] @ w^T (+ bias); w float32 or bfloat16 bits per s.bf16_weights.
void project(const DecoderShape& s, const float* x, const void* w, const float* bias, float* y, int64_t M, int64_t N,
             int64_t K, int threads);
// out[r] = weight * (x[r] * rsqrt(mean(x[r]^2) + eps)); out may be x.
void rms_norm(const float* x, const float* weight, float* out, int64_t rows, int64_t n, float eps);
// x [q, heads, D] rotated in place by the tables cos / sin [q, D].
void rope(float* x, int64_t q, int64_t heads, int64_t D, const float* cos, const float* sin);
// out [q, heads * D]: rows at cache slots start..start+q-1 attend to slots [0, start + q) (causal, or allowed
// [q, start + q], 1 = may attend); K/V must already be in the cache.
void attention(const DecoderShape& s, const float* qs, const LayerCache& cache, int64_t capacity, float* out,
               int64_t q, int64_t start, const uint8_t* allowed, int threads);
// g = silu(g) * u.
void silu_mul(float* g, const float* u, int64_t n);
}  // namespace ops

}  // namespace dart
