// Python bindings of the native decoder layers (decoder.hpp): class DecoderCache (a session's K/V buffers) and
// class Decoder. Checks every array at the boundary, then runs without the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "binding_checks.hpp"
#include "decoder.hpp"

namespace py = pybind11;

namespace {

using dart_bindings::c_contig;
using dart_bindings::is_f32;
using dart_bindings::is_u16;
using dart_bindings::is_i64;

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
    dart::fused_projections(shape, &w, shape.bf16_weights ? 2 : 4);
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

}  // namespace

void bind_decoder(py::module_& m) {
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
      .def_property_readonly("num_layers", [](const PyDecoder& d) { return d.layers.size(); })
      .def_property_readonly(
          "fused", [](const PyDecoder& d) {
            std::vector<std::pair<bool, bool>> out;
            for (const auto& w : d.layers) out.emplace_back(w.qkv_adjacent, w.gate_up_adjacent);
            return out;
          },
          "Per layer: (q/k/v run as one GEMM call, gate/up run as one): where their weights lie back to back.");
}
