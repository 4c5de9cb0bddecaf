// Python bindings of the native core (module dart_core._native). Thin: argument checks,
// numpy <-> C++ conversion and GIL release; the work lives in the other files.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "binding_checks.hpp"
#include "errors.hpp"
#include "ngram_builder.hpp"
#include "ngram_store.hpp"
#include "context_index.hpp"
#include "pruner.hpp"
#include "small_gemm.hpp"
#include "decoder.hpp"
#include "trie_import.hpp"

namespace py = pybind11;
using dart::NgramStore;

void bind_head_step(py::module_& m);   // head_bindings.cpp
void bind_context_index(py::module_& m);   // context_bindings.cpp

namespace {

using IdArray = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

// Copy int64 token ids into uint32, rejecting ids outside [0, vocab_size).
std::vector<uint32_t> checked_ids(const IdArray& a, uint32_t vocab_size, const char* what) {
  const int64_t* p = a.data();
  std::vector<uint32_t> out(static_cast<size_t>(a.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    if (p[i] < 0 || p[i] >= static_cast<int64_t>(vocab_size)) {
      throw py::value_error(std::string(what) + " holds token id " + std::to_string(p[i]) + " at position " +
                            std::to_string(i) + ", outside the table's vocabulary [0, " + std::to_string(vocab_size) +
                            "); was the table built for another tokenizer?");
    }
    out[i] = static_cast<uint32_t>(p[i]);
  }
  return out;
}

// Wall-clock and this thread's CPU time, so benchmarks on a shared machine can tell the
// work itself (CPU time) from time spent waiting for a core.
struct Stopwatch {
  std::chrono::steady_clock::time_point wall0 = std::chrono::steady_clock::now();
  double cpu0 = thread_cpu();
  static double thread_cpu() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  py::dict per(double ops) const {
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    const double cpu = thread_cpu() - cpu0;
    py::dict d;
    d["wall"] = wall / ops;
    d["cpu"] = cpu / ops;
    return d;
  }
};

template <class T>
py::array_t<T> to_numpy(std::vector<T>&& v) {
  auto* heap = new std::vector<T>(std::move(v));
  py::capsule owner(heap, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>({static_cast<py::ssize_t>(heap->size())}, {sizeof(T)}, heap->data(), owner);
}

py::dict header_dict(const NgramStore& s) {
  const auto& h = s.header();
  py::dict d;
  d["version"] = h.version;
  d["order"] = h.order;
  d["vocab_size"] = h.vocab_size;
  d["node_count"] = h.node_count;
  d["internal_count"] = h.internal_count;
  d["total_tokens"] = h.total_tokens;
  d["min_count"] = h.min_count;
  d["token_bytes"] = h.token_bytes;
  d["offset_bytes"] = h.offset_bytes;
  d["count_bytes"] = h.count_bytes;
  d["file_size"] = h.file_size;
  d["fingerprint"] = h.fingerprint;
  d["body_checksum"] = h.body_checksum;
  std::vector<uint64_t> levels;
  for (uint32_t l = 0; l <= h.order; ++l) levels.push_back(h.level_start[l + 1] - h.level_start[l]);
  d["level_sizes"] = levels;
  return d;
}

py::dict stats_dict(const dart::BuildStats& s) {
  py::dict d;
  d["node_count"] = s.node_count;
  d["file_size"] = s.file_size;
  d["total_tokens"] = s.total_tokens;
  d["level_sizes"] = s.level_sizes;
  d["runs"] = s.runs;
  return d;
}

// The small-GEMM path of that name; ValueError naming the caller and the known names for any other.
dart::GemmPath path_named(const std::string& name, const char* caller) {
  dart::GemmPath p;
  if (!dart::small_gemm_path_from_name(name, &p))
    throw py::value_error(std::string(caller) + ": '" + name + "' is not one of amx, avx512bf16, avx512, avx2, portable");
  return p;
}

// y = x @ w^T into a caller-owned y; every array must already have the right dtype and be
// C-contiguous (no silent copies: the caller packs weights once, at load time).
using dart_bindings::c_contig;
using dart_bindings::is_f32;

using dart_bindings::overlaps;

void small_gemm_checked(const py::array& x, const py::array& w, py::array& y, int threads) {
  if (x.ndim() != 2 || w.ndim() != 2 || y.ndim() != 2)
    throw py::value_error("small_gemm: x [M, K], w [N, K] and y [M, N] must be 2-D");
  if (!c_contig(x) || !c_contig(w) || !c_contig(y))
    throw py::value_error("small_gemm: x, w and y must be C-contiguous");
  if (!is_f32(x) || !is_f32(y))
    throw py::type_error("small_gemm: x and y must be float32");
  const int64_t M = x.shape(0), K = x.shape(1), N = w.shape(0);
  if (w.shape(1) != K || y.shape(0) != M || y.shape(1) != N)
    throw py::value_error("small_gemm: shapes do not match: x [" + std::to_string(M) + ", " + std::to_string(K) +
                          "], w [" + std::to_string(N) + ", " + std::to_string(w.shape(1)) + "], y [" +
                          std::to_string(y.shape(0)) + ", " + std::to_string(y.shape(1)) + "]");
  if (!y.writeable()) throw py::value_error("small_gemm: y is read-only");
  if (threads < 1) throw py::value_error("small_gemm: threads must be >= 1");
  // y is written while x and w are read: a shared byte would give wrong numbers, silently.
  if (overlaps(y, x) || overlaps(y, w))
    throw py::value_error(std::string("small_gemm: y shares memory with ") + (overlaps(y, x) ? "x" : "w") +
                          " (it is written while the inputs are read); pass a separate float32 [M, N] output, "
                          "e.g. np.empty((M, N), np.float32)");
  const float* xp = static_cast<const float*>(x.data());
  float* yp = static_cast<float*>(y.mutable_data());
  if (is_f32(w)) {
    const float* wp = static_cast<const float*>(w.data());
    py::gil_scoped_release release;
    dart::small_gemm_f32(xp, wp, yp, M, N, K, threads);
  } else if (w.dtype().is(py::dtype::of<uint16_t>())) {
    const uint16_t* wp = static_cast<const uint16_t*>(w.data());
    py::gil_scoped_release release;
    dart::small_gemm_bf16(xp, wp, yp, M, N, K, threads);
  } else {
    throw py::type_error("small_gemm: w must be float32 or uint16 (bfloat16 bit patterns)");
  }
}

// Benchmarks and the load-time kernel choice (dart_core/models/kernel_path.py): `rows` rows (1: the plain step's
// GEMV; a few: a tree's verify) through each weight matrix of `ws` in turn, `reps` times; the seconds of each sweep,
// timed here (no Python call between the matrices, as in the decoder).
std::vector<double> gemm_sweep(const std::vector<py::array>& ws, int threads, int reps, int rows) {
  if (threads < 1 || reps < 1 || rows < 1) throw py::value_error("gemm_sweep: threads, reps and rows must be >= 1");
  int64_t kmax = 1, nmax = 1;
  for (const auto& w : ws) {
    if (w.ndim() != 2 || !c_contig(w)) throw py::value_error("gemm_sweep: every w must be 2-D and C-contiguous");
    if (!is_f32(w) && !w.dtype().is(py::dtype::of<uint16_t>()))
      throw py::type_error("gemm_sweep: w must be float32 or uint16 (bfloat16 bit patterns)");
    nmax = std::max<int64_t>(nmax, w.shape(0));
    kmax = std::max<int64_t>(kmax, w.shape(1));
  }
  const int64_t M = rows;
  // x [M, kmax] and y [M, nmax]: a matrix of K columns reads the first M * K values as its [M, K] rows
  std::vector<float> x(static_cast<size_t>(dart_bindings::checked_mul(M, kmax, "gemm_sweep: ", "rows x K")));
  std::vector<float> y(static_cast<size_t>(dart_bindings::checked_mul(M, nmax, "gemm_sweep: ", "rows x N")));
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.01f * static_cast<float>(i % 97) - 0.5f;
  std::vector<double> out;
  py::gil_scoped_release release;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto& w : ws) {
      const int64_t N = w.shape(0), K = w.shape(1);
      if (is_f32(w)) dart::small_gemm_f32(x.data(), static_cast<const float*>(w.data()), y.data(), M, N, K, threads);
      else dart::small_gemm_bf16(x.data(), static_cast<const uint16_t*>(w.data()), y.data(), M, N, K, threads);
    }
    out.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return out;
}

// ---- decoder layers (dart_core/models/fast_forward.py) -----------------------------------------

void require(bool ok, const std::string& what) {
  if (!ok) throw py::value_error("native decoder: " + what);
}

int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  return dart_bindings::checked_mul(a, b, "native decoder: ", what);
}

// A session's K/V buffers, bound once: one float32 [kv_heads, capacity, head_dim] array per layer.
struct PyDecoderCache {
  std::vector<dart::LayerCache> layers;
  std::vector<py::array> keep;
  int64_t capacity = 0, kv_heads = 0, head_dim = 0;

  PyDecoderCache(const std::vector<py::array>& keys, const std::vector<py::array>& values) {
    require(!keys.empty() && keys.size() == values.size(), "keys and values need one array per layer");
    for (size_t l = 0; l < keys.size(); ++l) {
      for (const py::array& a : {keys[l], values[l]}) {
        require(a.ndim() == 3 && is_f32(a) && c_contig(a) && a.writeable(),
                "cache buffers must be writeable C-contiguous float32 [kv_heads, capacity, head_dim]");
        require(a.shape(0) == keys[0].shape(0) && a.shape(1) == keys[0].shape(1) && a.shape(2) == keys[0].shape(2),
                "every cache buffer must have the same shape");
        keep.push_back(a);
      }
      py::array k = keys[l], v = values[l];
      layers.push_back({static_cast<float*>(k.mutable_data()), static_cast<float*>(v.mutable_data())});
    }
    kv_heads = keys[0].shape(0);
    capacity = keys[0].shape(1);
    head_dim = keys[0].shape(2);
  }

  // After a verify: slot prefix + offsets[k] moves to slot prefix + first + k, in every layer and K/V head (the
  // accepted path made contiguous). offsets are strictly increasing and offsets[k] >= first + k, so copying in
  // order never overwrites a slot still to be read.
  void keep_rows(int64_t prefix, const std::vector<int64_t>& offsets, int64_t first) {
    // Every bound is checked against the capacity before any sum is formed: prefix + offsets[k] (or first + k)
    // of two huge values must not wrap negative and pass a "< capacity" test.
    require(prefix >= 0 && first >= 0, "keep_rows: prefix and first must be >= 0");
    require(prefix <= capacity, "keep_rows: prefix " + std::to_string(prefix) + " is outside the cache of " +
                                   std::to_string(capacity));
    const int64_t n = static_cast<int64_t>(offsets.size());
    require(n <= capacity && first <= capacity - prefix - n,
            "keep_rows: " + std::to_string(n) + " rows from slot " + std::to_string(first) + " after the prefix do "
            "not fit the cache of " + std::to_string(capacity));
    for (int64_t k = 0; k < n; ++k) {
      require(k == 0 || offsets[k] > offsets[k - 1], "keep_rows: offsets must be strictly increasing");
      require(offsets[k] >= first + k, "keep_rows: offset " + std::to_string(offsets[k]) + " lies before its "
                                       "destination " + std::to_string(first + k));
      require(offsets[k] < capacity - prefix, "keep_rows: slot prefix + " + std::to_string(offsets[k]) +
                                                  " is outside the cache of " + std::to_string(capacity));
    }
    const size_t row = static_cast<size_t>(head_dim) * sizeof(float);
    for (const dart::LayerCache& layer : layers)
      for (float* buffer : {layer.keys, layer.values})
        for (int64_t h = 0; h < kv_heads; ++h) {
          float* slots = buffer + h * capacity * head_dim;
          for (int64_t k = 0; k < n; ++k)
            if (offsets[k] != first + k)
              std::memcpy(slots + (prefix + first + k) * head_dim, slots + (prefix + offsets[k]) * head_dim, row);
        }
  }
};

// The model's layer weights, borrowed from torch tensors (numpy views kept alive here).
struct PyDecoder {
  dart::DecoderShape shape;
  std::vector<dart::LayerWeights> layers;
  std::vector<py::array> keep;

  PyDecoder(int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t intermediate, float eps,
            bool bf16_weights) {
    require(hidden > 0 && heads > 0 && kv_heads > 0 && head_dim > 0 && intermediate > 0, "sizes must be positive");
    // Checked here, at the boundary: a product that wraps (heads x head_dim of 4 x 2^62 is 0 in int64) would
    // let misshaped weights through the shape checks of add_layer.
    const int64_t qd = checked_mul(heads, head_dim, "heads x head_dim");
    const int64_t kvd = checked_mul(kv_heads, head_dim, "kv_heads x head_dim");
    checked_mul(qd, hidden, "heads x head_dim x hidden");
    checked_mul(kvd, hidden, "kv_heads x head_dim x hidden");
    checked_mul(intermediate, hidden, "intermediate x hidden");
    require(heads % kv_heads == 0, "heads must be a multiple of kv_heads");
    // RoPE rotates the two halves of each head; an odd size would leave its last element unrotated.
    require(head_dim % 2 == 0, "head_dim " + std::to_string(head_dim) +
                                   " is odd, but RoPE needs an even head_dim (it rotates the two halves of each "
                                   "head); check the model config's head_dim, or run this model on the HF forward");
    shape = {hidden, heads, kv_heads, head_dim, intermediate, eps, bf16_weights};
  }

  const void* weight(const py::dict& d, const char* name, int64_t rows, int64_t cols) {
    require(d.contains(name), std::string("layer lacks ") + name);
    py::array a = d[name].cast<py::array>();
    const bool dtype_ok = shape.bf16_weights ? a.dtype().is(py::dtype::of<uint16_t>()) : is_f32(a);
    require(dtype_ok, std::string(name) + (shape.bf16_weights ? " must be uint16 (bfloat16 bits)" : " must be float32"));
    require(a.ndim() == 2 && a.shape(0) == rows && a.shape(1) == cols && c_contig(a),
            std::string(name) + " must be C-contiguous [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
    keep.push_back(a);
    return a.data();
  }
  const float* vec(const py::dict& d, const char* name, int64_t n, bool optional) {
    if (!d.contains(name) || d[name].is_none()) {
      require(optional, std::string("layer lacks ") + name);
      return nullptr;
    }
    py::array a = d[name].cast<py::array>();
    require(a.ndim() == 1 && a.shape(0) == n && is_f32(a) && c_contig(a),
            std::string(name) + " must be float32 [" + std::to_string(n) + "]");
    keep.push_back(a);
    return static_cast<const float*>(a.data());
  }

  void add_layer(const py::dict& d) {
    const int64_t hid = shape.hidden, qd = shape.heads * shape.head_dim, kvd = shape.kv_heads * shape.head_dim,
                  I = shape.intermediate, D = shape.head_dim;
    dart::LayerWeights w;
    w.q = weight(d, "q", qd, hid);
    w.k = weight(d, "k", kvd, hid);
    w.v = weight(d, "v", kvd, hid);
    w.o = weight(d, "o", hid, qd);
    w.gate = weight(d, "gate", I, hid);
    w.up = weight(d, "up", I, hid);
    w.down = weight(d, "down", hid, I);
    w.q_bias = vec(d, "q_bias", qd, true);
    w.k_bias = vec(d, "k_bias", kvd, true);
    w.v_bias = vec(d, "v_bias", kvd, true);
    w.in_norm = vec(d, "in_norm", hid, false);
    w.post_norm = vec(d, "post_norm", hid, false);
    w.q_norm = vec(d, "q_norm", D, true);
    w.k_norm = vec(d, "k_norm", D, true);
    layers.push_back(w);
  }

  void run(py::array h, py::array cos, py::array sin, py::object allowed, int64_t start, const PyDecoderCache& cache,
           int64_t begin, int64_t end, int threads) {
    require(h.ndim() == 2 && h.shape(1) == shape.hidden && is_f32(h) && c_contig(h) && h.writeable(),
            "h must be writeable C-contiguous float32 [q, hidden]");
    const int64_t q = h.shape(0), D = shape.head_dim;
    for (const py::array& a : {cos, sin})
      require(a.ndim() == 2 && a.shape(0) == q && a.shape(1) == D && is_f32(a) && c_contig(a),
              "cos and sin must be C-contiguous float32 [q, head_dim]");
    require(cache.layers.size() == layers.size() && cache.kv_heads == shape.kv_heads && cache.head_dim == D,
            "the cache was made for another model");
    require(start >= 0 && start <= cache.capacity && q <= cache.capacity - start,   // no start + q: it can wrap
            "the step does not fit the cache");
    require(threads >= 1, "threads must be >= 1");
    py::array mask;
    const uint8_t* mp = nullptr;
    if (!allowed.is_none()) {
      mask = allowed.cast<py::array>();
      require(mask.ndim() == 2 && mask.shape(0) == q && mask.shape(1) == start + q && mask.itemsize() == 1 &&
                  c_contig(mask),
              "allowed must be a C-contiguous bool [q, start + q] array");
      mp = static_cast<const uint8_t*>(mask.data());
    }
    float* hp = static_cast<float*>(h.mutable_data());
    const float* cp = static_cast<const float*>(cos.data());
    const float* sp = static_cast<const float*>(sin.data());
    py::gil_scoped_release release;
    dart::decoder_layers(shape, layers, cache.layers, cache.capacity, begin, end, hp, q, cp, sp, mp, start, threads);
  }
};

// The pruner's knobs, read whole from a PruningConfig (or any object / dict with its fields); every
// field must be present: the defaults live in PruningConfig only.
dart::PruneParams params_from(const py::handle& config) {
  const bool is_dict = py::isinstance<py::dict>(config);
  auto field = [&](const char* name) -> py::object {
    if (is_dict) {
      py::dict d = py::reinterpret_borrow<py::dict>(config);
      if (!d.contains(name)) throw py::value_error(std::string("pruning config has no field '") + name + "'");
      return d[name];
    }
    if (!py::hasattr(config, name)) throw py::value_error(std::string("pruning config has no field '") + name + "'");
    return config.attr(name);
  };
  dart::PruneParams p{};
  p.level_top_k = field("level_top_k").cast<int64_t>();
  p.beam_width = field("beam_width").cast<int64_t>();
  p.budget = field("budget").cast<int64_t>();
  p.level_decay = field("level_decay").cast<double>();
  p.logit_decay = field("logit_decay").cast<double>();
  p.ngram_weight = field("ngram_weight").cast<double>();
  p.eps = field("eps").cast<double>();
  p.context_weight = field("context_weight").cast<double>();
  p.context_top_k = field("context_top_k").cast<int64_t>();
  return p;
}

// Checked, contiguous pruner inputs.
struct PruneInputs {
  py::array_t<float, py::array::c_style | py::array::forcecast> logits;
  IdArray tokens, context, eos;
  size_t rows = 0, k = 0;
};

PruneInputs check_prune_inputs(py::array logits, py::array tokens, py::array context, py::array eos,
                               const NgramStore* store, const dart::ContextIndex* live) {
  PruneInputs in;
  in.logits = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(logits);
  in.tokens = IdArray::ensure(tokens);
  in.context = IdArray::ensure(context);
  in.eos = IdArray::ensure(eos);
  if (!in.logits || !in.tokens || !in.context || !in.eos) throw py::type_error("pruner inputs must be numeric arrays");
  if (in.logits.ndim() != 2 || in.tokens.ndim() != 2 || in.logits.shape(0) != in.tokens.shape(0) ||
      in.logits.shape(1) != in.tokens.shape(1)) {
    throw py::value_error("topk_logits and topk_tokens must both be [D+1, k] with the same shape");
  }
  if (in.context.ndim() != 1 || in.context.size() < 1) {
    throw py::value_error("context must be a 1-D sequence ending with the root token");
  }
  in.rows = static_cast<size_t>(in.logits.shape(0));
  in.k = static_cast<size_t>(in.logits.shape(1));
  if (store != nullptr) {
    checked_ids(in.tokens, store->header().vocab_size, "topk_tokens");
    checked_ids(in.context, store->header().vocab_size, "context");
  }
  if (live != nullptr) {
    checked_ids(in.tokens, static_cast<uint32_t>(live->vocab_size()), "topk_tokens");
    checked_ids(in.context, static_cast<uint32_t>(live->vocab_size()), "context");
    // context candidates come from the index and are looked up in the table: its ids must be the table's
    if (store != nullptr && live->vocab_size() > store->header().vocab_size) {
      throw py::value_error("the context index's vocabulary (" + std::to_string(live->vocab_size()) +
                            ") is larger than the N-gram table's (" + std::to_string(store->header().vocab_size) +
                            "): build both for the target's tokenizer");
    }
  }
  return in;
}

py::dict prune_result_dict(dart::PruneResult&& r) {
  py::dict d;
  d["token"] = to_numpy(std::move(r.token));
  d["parent"] = to_numpy(std::move(r.parent));
  d["depth"] = to_numpy(std::move(r.depth));
  d["node"] = to_numpy(std::move(r.node));
  d["logit_term"] = to_numpy(std::move(r.logit_term));
  d["ngram_term"] = to_numpy(std::move(r.ngram_term));
  d["score"] = to_numpy(std::move(r.score));
  d["kept"] = to_numpy(std::move(r.kept));
  d["source"] = to_numpy(std::move(r.source));
  d["tree_tokens"] = to_numpy(std::move(r.tree_tokens));
  d["tree_parents"] = to_numpy(std::move(r.tree_parents));
  d["tree_depths"] = to_numpy(std::move(r.tree_depths));
  d["tree_scores"] = to_numpy(std::move(r.tree_scores));
  return d;
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "DART native core: memory-mapped N-gram store, table builder, .trie importer and tree pruner";
  m.def("abi_version", []() { return 6; }, "Version of the native ABI, bumped when a binding changes.");
  m.def("small_gemm", &small_gemm_checked, py::arg("x"), py::arg("w"), py::arg("y"), py::arg("threads") = 1,
        "y = x @ w.T for float32 x [M, K] and w [N, K] (float32, or uint16 holding bfloat16), written into "
        "float32 y [M, N]. Reads w once for all M rows; see native/src/small_gemm.hpp.");
  py::class_<PyDecoderCache>(m, "DecoderCache", "A session's K/V buffers bound for the native decoder.")
      .def(py::init<const std::vector<py::array>&, const std::vector<py::array>&>(), py::arg("keys"),
           py::arg("values"))
      .def_readonly("capacity", &PyDecoderCache::capacity)
      .def("keep_rows", &PyDecoderCache::keep_rows, py::arg("prefix"), py::arg("offsets"), py::arg("first"),
           "Move slot prefix + offsets[k] to slot prefix + first + k in every buffer (a verify's accepted path "
           "made contiguous); offsets strictly increasing, offsets[k] >= first + k.");
  py::class_<PyDecoder>(m, "Decoder", "Llama/Qwen2/Qwen3 decoder layers on a CPU, a few dozen positions per call (native/src/decoder.hpp).")
      .def(py::init<int64_t, int64_t, int64_t, int64_t, int64_t, float, bool>(), py::arg("hidden"),
           py::arg("heads"), py::arg("kv_heads"), py::arg("head_dim"), py::arg("intermediate"), py::arg("eps"),
           py::arg("bf16_weights"))
      .def("add_layer", &PyDecoder::add_layer, py::arg("arrays"))
      .def("run", &PyDecoder::run, py::arg("h"), py::arg("cos"), py::arg("sin"), py::arg("allowed"),
           py::arg("start"), py::arg("cache"), py::arg("begin"), py::arg("end"), py::arg("threads"))
      .def_property_readonly("num_layers", [](const PyDecoder& d) { return d.layers.size(); });
  bind_head_step(m);
  bind_context_index(m);
  m.def("stream_read", [](const py::array& buf, int threads) {
    if (!c_contig(buf)) throw py::value_error("stream_read: the buffer must be C-contiguous");
    const void* p = buf.data();
    const int64_t bytes = static_cast<int64_t>(buf.nbytes());
    py::gil_scoped_release release;
    return dart::stream_read(p, bytes, threads);
  }, py::arg("buf"), py::arg("threads") = 1,
        "Reads every byte of a contiguous array once with `threads` threads, each a contiguous range (a plain "
        "memory read-bandwidth loop for benchmarks); returns a checksum.");
  m.def("_small_gemm_set_legacy", &dart::small_gemm_set_legacy, py::arg("on"),
        "Benchmarks only: run the small-GEMM calls as before the thread pool (OpenMP region per call, equal "
        "ranges; one row with 256-bit blocks). The same results either way.");
  m.def("_small_gemm_set_many_rows", &dart::small_gemm_set_many_rows, py::arg("rows"),
        "Benchmarks only: the AVX-512 path's row count from which a call widens each bf16 weight block once for all "
        "its rows (default 12). The same results at any value.");
  m.def("_small_gemm_many_rows", &dart::small_gemm_many_rows);
  m.def("gemm_sweep", &gemm_sweep, py::arg("ws"), py::arg("threads") = 1, py::arg("reps") = 1, py::arg("rows") = 1,
        "Benchmarks and the load-time kernel choice: `rows` float32 rows through each weight matrix of `ws` in turn "
        "(the small-GEMM kernel on the current path; rows = 1 is the plain step's GEMV), `reps` times; the seconds of "
        "each sweep.");
  m.def("small_gemm_has_avx2", &dart::small_gemm_has_avx2, "True when this CPU runs the AVX2+FMA small-GEMM kernel.");
  m.def("small_gemm_path", []() { return std::string(dart::small_gemm_path_name(dart::small_gemm_path())); },
        "The small-GEMM kernel calls run now: 'amx', 'avx512bf16', 'avx512', 'avx2' or 'portable' (the default, unless "
        "DART_GEMM_PATH or small_gemm_set_path chose another).");
  m.def("small_gemm_paths", []() {
    std::vector<std::string> out;
    for (int p = static_cast<int>(dart::small_gemm_best_path()); p >= 0; --p)
      out.emplace_back(dart::small_gemm_path_name(static_cast<dart::GemmPath>(p)));
    return out;
  }, "The small-GEMM paths this CPU runs, best first.");
  m.def("_small_gemm_best_path_for", [](bool avx2, bool avx512, bool avx512bf16, bool amx) {
    return std::string(dart::small_gemm_path_name(dart::small_gemm_best_path_for(avx2, avx512, avx512bf16, amx)));
  }, py::arg("avx2"), py::arg("avx512"), py::arg("avx512bf16"), py::arg("amx"),
        "Tests: the best small-GEMM path for a CPU with these features (what small_gemm_paths()[0] is on this one).");
  m.def("_small_gemm_default_path_for", [](const std::string& best, bool amd) {
    const dart::GemmPath p = path_named(best, "_small_gemm_default_path_for");
    return std::string(dart::small_gemm_path_name(dart::small_gemm_default_path_for(p, amd)));
  }, py::arg("best"), py::arg("amd"),
        "Tests: the path 'auto' runs on a CPU whose best path is `best` (AMD or not).");
  m.def("small_gemm_path_source", []() { return std::string(dart::small_gemm_path_source()); },
        "Who chose the path calls run now: 'set' (small_gemm_set_path), 'DART_GEMM_PATH' (the variable names a "
        "path) or 'default' (neither; the load-time measurement may choose another).");
  m.def("small_gemm_set_path", [](const std::string& name) {
    dart::GemmPath p;
    if (dart::small_gemm_path_from_name(name, &p)) return dart::small_gemm_set_path(p);
    if (name == "auto") return dart::small_gemm_release_path();   // nothing forced: DART_GEMM_PATH or the default
    throw py::value_error("small_gemm_set_path: '" + name + "' is not one of amx, avx512bf16, avx512, avx2, portable, auto");
  }, py::arg("path"),
        "Force the small-GEMM path of later calls (the decoder's included): 'amx', 'avx512bf16', 'avx512', 'avx2', "
        "'portable', or 'auto' to force none (DART_GEMM_PATH's path, else the default: the best, except that "
        "avx512bf16 is the default on AMD CPUs only; a model's load then times the paths, models/kernel_path.py). "
        "ValueError when this CPU cannot run it. For tests and benchmarks; not thread-safe against calls in flight.");
  m.def("small_gemm_set_gemv_prefetch", [](const std::string& name, bool on) {
    dart::small_gemm_set_gemv_prefetch(path_named(name, "small_gemm_set_gemv_prefetch"), on);
  }, py::arg("path"), py::arg("on"),
        "Whether the one-row kernel (M = 1: a plain decoding step) of that path prefetches the next block of weight "
        "rows in software (default True). Only the speed depends on it, never a result; "
        "dart_core.models.gemv_prefetch measures which is faster on this machine.");
  m.def("small_gemm_gemv_prefetch", [](const std::string& name) {
    return dart::small_gemm_gemv_prefetch(path_named(name, "small_gemm_gemv_prefetch"));
  }, py::arg("path"), "Whether the one-row kernel of that path prefetches the next weight block in software.");
  m.def("has_openmp", []() {
#if defined(_OPENMP)
    return true;
#else
    return false;
#endif
  }, "Whether this build was compiled with OpenMP (used by the builder's parallel sort and checksums).");

  auto format_error = py::register_exception<dart::FormatError>(m, "FormatError", PyExc_ValueError);
  format_error.doc() = "A table or .trie file is truncated, corrupted, of another version or not what it claims.";
  py::register_exception<dart::IoError>(m, "IoError", PyExc_OSError);

  py::class_<NgramStore>(m, "NgramStore", "A read-only memory-mapped N-gram table (see ngram_format.hpp).")
      .def(py::init<const std::string&, bool>(), py::arg("path"), py::arg("verify") = false,
           py::call_guard<py::gil_scoped_release>(),
           "Map the table at `path` and check its header (O(1)); with verify=True also its checksum and structure.")
      .def_property_readonly("order", [](const NgramStore& s) { return s.header().order; }, "N-gram order.")
      .def_property_readonly("vocab_size", [](const NgramStore& s) { return s.header().vocab_size; },
                             "Token ids must be below this.")
      .def_property_readonly("node_count", [](const NgramStore& s) { return s.header().node_count; },
                             "Trie nodes, root included.")
      .def_property_readonly("fingerprint", [](const NgramStore& s) { return s.header().fingerprint; },
                             "Fingerprint of the tokenizer the table was built with.")
      .def_property_readonly("path", &NgramStore::path, "Path the table was opened from.")
      .def("header", &header_dict, "All header fields as a dict.")
      .def("metadata", &NgramStore::metadata, "The builder's JSON metadata (sources, command).")
      .def("verify", &NgramStore::verify, py::call_guard<py::gil_scoped_release>(),
           "Check the body checksum and structure; raises FormatError on the first problem.")
      .def(
          "query",
          [](const NgramStore& s, const IdArray& context, const IdArray& candidates) {
            if (context.ndim() != 1 || candidates.ndim() != 1) throw py::value_error("context and candidates must be 1-D");
            auto ctx = checked_ids(context, s.header().vocab_size, "context");
            auto cand = checked_ids(candidates, s.header().vocab_size, "candidates");
            py::array_t<double> probs(static_cast<py::ssize_t>(cand.size()));
            py::array_t<int32_t> matched(static_cast<py::ssize_t>(cand.size()));
            double* pp = probs.mutable_data();
            int32_t* mp = matched.mutable_data();
            {
              py::gil_scoped_release release;
              s.query(ctx.data(), ctx.size(), cand.data(), cand.size(), pp, mp);
            }
            return py::make_tuple(probs, matched);
          },
          py::arg("context"), py::arg("candidates"),
          "P(candidate | context) with the original per-candidate back-off, and the matched context length "
          "(0 = never matched, P = 0). Returns (probs float64 [n], matched int32 [n]).")
      .def(
          "continuations",
          [](const NgramStore& s, const IdArray& context) {
            auto ctx = checked_ids(context, s.header().vocab_size, "context");
            auto c = s.continuations(ctx.data(), ctx.size());
            std::vector<int64_t> toks(c.tokens.begin(), c.tokens.end());
            std::vector<int64_t> counts(c.counts.begin(), c.counts.end());
            return py::make_tuple(c.matched, c.context_count, to_numpy(std::move(toks)), to_numpy(std::move(counts)));
          },
          py::arg("context"),
          "Children of the longest context suffix in the table: (matched_len, context_count, tokens, counts).")
      .def(
          "bench_query",
          [](const NgramStore& s, const IdArray& contexts, const IdArray& candidates, int repeats) {
            if (contexts.ndim() != 2 || candidates.ndim() != 2 || contexts.shape(0) != candidates.shape(0)) {
              throw py::value_error("contexts [Q, L] and candidates [Q, K] must have the same Q");
            }
            if (contexts.shape(0) < 1) throw py::value_error("bench_query needs at least one query row");
            if (repeats < 1) throw py::value_error("bench_query: repeats must be >= 1");
            auto ctx = checked_ids(contexts, s.header().vocab_size, "contexts");
            auto cand = checked_ids(candidates, s.header().vocab_size, "candidates");
            const size_t q = contexts.shape(0), L = contexts.shape(1), K = candidates.shape(1);
            std::vector<double> probs(K);
            std::vector<int32_t> matched(K);
            double sink = 0;
            std::unique_ptr<Stopwatch> watch;
            {
              py::gil_scoped_release release;
              watch.reset(new Stopwatch());
              for (int r = 0; r < repeats; ++r) {
                for (size_t i = 0; i < q; ++i) {
                  s.query(ctx.data() + i * L, L, cand.data() + i * K, K, probs.data(), matched.data());
                  if (K > 0) sink += probs[0];   // no candidates: nothing to read
                }
              }
            }
            auto out = watch->per(static_cast<double>(q) * repeats);
            out["checksum"] = sink;
            return out;
          },
          py::arg("contexts"), py::arg("candidates"), py::arg("repeats") = 10,
          "Benchmark: {'wall', 'cpu'} mean seconds per native query over the rows of contexts x candidates "
          "(no Python in the loop; cpu = this thread's CPU time).");

  py::class_<dart::TableBuilder>(m, "TableBuilder",
                                 "Counts n-grams of token-id documents in bounded memory and writes a table.")
      .def(py::init([](uint32_t order, uint32_t vocab_size, const std::string& tmp_dir, uint64_t chunk_tokens) {
             return dart::TableBuilder::create(order, vocab_size, tmp_dir, chunk_tokens);
           }),
           py::arg("order"), py::arg("vocab_size"), py::arg("tmp_dir"), py::arg("chunk_tokens") = 1u << 23,
           "order 1..8; run files go to tmp_dir (which the caller creates and removes).")
      .def(
          "add_documents",
          [](dart::TableBuilder& b, const IdArray& tokens, const IdArray& lengths, uint32_t vocab_size) {
            // The builder packs ids into the bits its own vocabulary needs: a larger vocab_size
            // here would let wider ids through and corrupt the table.
            if (vocab_size != b.vocab_size()) {
              throw py::value_error("add_documents: vocab_size " + std::to_string(vocab_size) +
                                    " does not match the builder, which was built for " +
                                    std::to_string(b.vocab_size()) +
                                    " ids; pass the same vocab_size to TableBuilder and add_documents");
            }
            if (tokens.ndim() != 1 || lengths.ndim() != 1)
              throw py::value_error("add_documents: tokens and lengths must be 1-D arrays");
            // Lengths are checked, and summed without wrapping, before anything is copied: lengths that
            // sum to the token count only modulo 2^64 once made the builder read past `tokens`.
            const int64_t* lp = lengths.data();
            const uint64_t n_tokens = static_cast<uint64_t>(tokens.size());
            std::vector<uint64_t> lens(static_cast<size_t>(lengths.size()));
            uint64_t total = 0;
            for (size_t i = 0; i < lens.size(); ++i) {
              if (lp[i] < 0)
                throw py::value_error("add_documents: document " + std::to_string(i) + " has negative length " +
                                      std::to_string(lp[i]) + "; lengths must be token counts (>= 0)");
              lens[i] = static_cast<uint64_t>(lp[i]);
              if (lens[i] > n_tokens - total)
                throw py::value_error("add_documents: document lengths add up to more than the " +
                                      std::to_string(n_tokens) + " tokens given (at document " + std::to_string(i) +
                                      ", length " + std::to_string(lp[i]) +
                                      "); pass one length per document, summing to len(tokens)");
              total += lens[i];
            }
            if (total != n_tokens)
              throw py::value_error("add_documents: document lengths sum to " + std::to_string(total) + ", but " +
                                    std::to_string(n_tokens) +
                                    " tokens were given; pass one length per document, summing to len(tokens)");
            auto ids = checked_ids(tokens, b.vocab_size(), "documents");
            py::gil_scoped_release release;
            b.add_documents(ids.data(), ids.size(), lens.data(), lens.size());
          },
          py::arg("tokens"), py::arg("lengths"), py::arg("vocab_size"),
          "Add documents laid end to end in `tokens` (int ids < vocab_size) with the given lengths.")
      .def_property_readonly("total_tokens", &dart::TableBuilder::total_tokens, "Tokens added so far.")
      .def(
          "finish",
          [](dart::TableBuilder& b, const std::string& out, uint32_t min_count, const std::string& fingerprint,
             const std::string& metadata) {
            dart::BuildStats s;
            {
              py::gil_scoped_release release;
              s = b.finish(out, min_count, fingerprint, metadata);
            }
            return stats_dict(s);
          },
          py::arg("out_path"), py::arg("min_count") = 1, py::arg("fingerprint") = "", py::arg("metadata") = "{}",
          "Merge, prune (count < min_count) and write the table atomically; returns build statistics.");

  m.def(
      "import_original_trie",
      [](const std::string& src, const std::string& dst, uint32_t vocab_size, const std::string& fingerprint,
         const std::string& metadata, uint32_t min_count, const std::string& tmp_dir, uint64_t chunk_records,
         std::function<void(uint64_t, uint64_t)> progress) {
        std::function<void(uint64_t, uint64_t)> cb;
        if (progress) {
          cb = [progress](uint64_t done, uint64_t total) {
            py::gil_scoped_acquire acquire;
            progress(done, total);
          };
        }
        dart::BuildStats s;
        {
          py::gil_scoped_release release;
          s = dart::import_original_trie(src, dst, vocab_size, fingerprint, metadata, min_count, tmp_dir,
                                         chunk_records, cb);
        }
        return stats_dict(s);
      },
      py::arg("src"), py::arg("dst"), py::arg("vocab_size"), py::arg("fingerprint") = "", py::arg("metadata") = "{}",
      py::arg("min_count") = 1, py::arg("tmp_dir") = ".", py::arg("chunk_records") = 1u << 23,
      py::arg("progress") = nullptr,
      "Stream an original DART .trie into a table at dst; progress(bytes_read, total_bytes) is called now and then.");

  m.def(
      "prune_dart_tree",
      [](py::array logits, py::array tokens, py::array context, const NgramStore* store, py::array eos,
         py::object config, const dart::ContextIndex* live) {
        auto in = check_prune_inputs(logits, tokens, context, eos, store, live);
        auto params = params_from(config);
        dart::PruneResult r;
        {
          py::gil_scoped_release release;
          r = dart::prune_tree(in.logits.data(), in.tokens.data(), in.rows, in.k, in.context.data(),
                               static_cast<size_t>(in.context.size()), store, in.eos.data(),
                               static_cast<size_t>(in.eos.size()), params, live);
        }
        return prune_result_dict(std::move(r));
      },
      py::arg("topk_logits"), py::arg("topk_tokens"), py::arg("context"), py::arg("store").none(true),
      py::arg("eos_token_ids"), py::arg("config"), py::arg("live") = nullptr,
      "DART tree pruning (docs/ARCHITECTURE.md section 5) with config a PruningConfig (or a dict of its fields). "
      "Returns a dict of numpy arrays: every scored candidate "
      "(token, parent, depth, logit_term, ngram_term, score, kept, node) and the tree (tree_tokens, "
      "tree_parents, tree_depths, tree_scores; node 0 = root).");

  m.def(
      "bench_prune",
      [](py::array logits, py::array tokens, py::array context, const NgramStore* store, py::array eos,
         py::object config, int repeats, const dart::ContextIndex* live) {
        if (repeats < 1) throw py::value_error("bench_prune: repeats must be >= 1");
        auto in = check_prune_inputs(logits, tokens, context, eos, store, live);
        auto params = params_from(config);
        size_t sink = 0;
        std::unique_ptr<Stopwatch> watch;
        {
          py::gil_scoped_release release;
          watch.reset(new Stopwatch());
          for (int r = 0; r < repeats; ++r) {
            auto res = dart::prune_tree(in.logits.data(), in.tokens.data(), in.rows, in.k, in.context.data(),
                                        static_cast<size_t>(in.context.size()), store, in.eos.data(),
                                        static_cast<size_t>(in.eos.size()), params, live);
            sink += res.tree_tokens.size();
          }
        }
        auto out = watch->per(repeats);
        out["nodes"] = sink / static_cast<size_t>(repeats);
        return out;
      },
      py::arg("topk_logits"), py::arg("topk_tokens"), py::arg("context"), py::arg("store").none(true),
      py::arg("eos_token_ids"), py::arg("config"), py::arg("repeats") = 100, py::arg("live") = nullptr,
      "Benchmark: {'wall', 'cpu'} mean seconds per native prune_tree call (inputs checked once, no Python in "
      "the loop; cpu = this thread's CPU time).");
}
