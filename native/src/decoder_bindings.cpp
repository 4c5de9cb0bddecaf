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
#include "small_gemm.hpp"

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

  // The checks a step's cache, position and mask share (run and forward): returns the mask's bytes (null: causal),
  // the array kept in *mask.
  const uint8_t* checked_step(const PyDecoderCache& cache, const py::object& allowed, int64_t q, int64_t start,
                              int threads, py::array* mask) const {
    require(cache.layers.size() == layers.size() && cache.kv_heads == shape.kv_heads &&
                cache.head_dim == shape.head_dim,
            "the cache was made for another model");
    require(start >= 0 && start <= cache.capacity && q <= cache.capacity - start,   // no start + q: it can wrap
            "the step does not fit the cache");
    require(threads >= 1, "threads must be >= 1");
    if (allowed.is_none()) return nullptr;
    *mask = allowed.cast<py::array>();
    require(mask->ndim() == 2 && mask->shape(0) == q && mask->shape(1) == start + q && mask->itemsize() == 1 &&
                c_contig(*mask),
            "allowed must be a C-contiguous bool [q, start + q] array");
    return static_cast<const uint8_t*>(mask->data());
  }

  void run(py::array h, py::array cos, py::array sin, py::object allowed, int64_t start, const PyDecoderCache& cache,
           int64_t begin, int64_t end, int threads) {
    require(h.ndim() == 2 && h.shape(1) == shape.hidden && is_f32(h) && c_contig(h) && h.writeable(),
            "h must be writeable C-contiguous float32 [q, hidden]");
    const int64_t q = h.shape(0), D = shape.head_dim;
    for (const py::array& a : {cos, sin})
      require(a.ndim() == 2 && a.shape(0) == q && a.shape(1) == D && is_f32(a) && c_contig(a),
              "cos and sin must be C-contiguous float32 [q, head_dim]");
    py::array mask;   // keeps the mask alive while the step runs
    const uint8_t* mp = checked_step(cache, allowed, q, start, threads, &mask);
    float* hp = static_cast<float*>(h.mutable_data());
    const float* cp = static_cast<const float*>(cos.data());
    const float* sp = static_cast<const float*>(sin.data());
    py::gil_scoped_release release;
    dart::decoder_layers(shape, layers, cache.layers, cache.capacity, begin, end, hp, q, cp, sp, mp, start, threads);
  }

  // The step's two ends, bound once: the token embedding table [vocab, hidden] (bf16 bits or float32, as the layers'
  // weights), the final norm's weight [hidden] and the LM head [head_vocab, hidden] (bf16 bits or float32).
  const void* embed = nullptr;
  int64_t vocab = 0;
  const float* final_norm = nullptr;
  const void* lm_head = nullptr;
  int64_t head_vocab = 0;
  bool lm_head_bf16 = false;

  void set_ends(py::array table, py::array norm, py::array head) {
    const bool dtype_ok = shape.bf16_weights ? is_u16(table) : is_f32(table);
    require(dtype_ok && table.ndim() == 2 && table.shape(1) == shape.hidden && table.shape(0) > 0 && c_contig(table),
            std::string("the embedding table must be C-contiguous ") + (shape.bf16_weights ? "uint16 (bfloat16 bits)" : "float32") +
                " [vocab, " + std::to_string(shape.hidden) + "]");
    require(norm.ndim() == 1 && norm.shape(0) == shape.hidden && is_f32(norm) && c_contig(norm),
            "the final norm's weight must be float32 [" + std::to_string(shape.hidden) + "]");
    require((is_u16(head) || is_f32(head)) && head.ndim() == 2 && head.shape(1) == shape.hidden && head.shape(0) > 0 &&
                c_contig(head),
            "the LM head must be C-contiguous uint16 (bfloat16 bits) or float32 [vocab, " +
                std::to_string(shape.hidden) + "]");
    keep.push_back(table);
    keep.push_back(norm);
    keep.push_back(head);
    lm_head = head.data();
    head_vocab = head.shape(0);
    lm_head_bf16 = is_u16(head);
    embed = table.data();
    vocab = table.shape(0);
    final_norm = static_cast<const float*>(norm.data());
  }

  // One whole step (or prompt chunk) in one call, without the GIL: the embedding rows of `ids`, every layer (RoPE rows
  // taken from the tables by position), the hidden states entering each layer of `aux_layers` copied into aux_out's
  // column blocks (in that order; the id num_layers = after the last layer), and the final norm of every row, or of
  // the last one alone (out [1, hidden]), into out (None: no norm, an inner chunk of a prompt); then the LM head's
  // logits of out's rows head_rows, in that order, into logits [len(head_rows), head_vocab] (the same kernel and bits
  // as small_gemm on those rows alone: a row's logits do not depend on the others).
  void forward(py::array ids, py::array positions, py::array cos_table, py::array sin_table, py::object allowed,
               int64_t start, const PyDecoderCache& cache, const std::vector<int64_t>& aux_layers, py::object aux_out,
               py::object out, const std::vector<int64_t>& head_rows, py::object logits, int threads) {
    require(embed != nullptr, "forward needs set_ends (the embedding table and the final norm) first");
    require(ids.ndim() == 1 && is_i64(ids) && c_contig(ids), "ids must be C-contiguous int64 [q]");
    const int64_t q = ids.shape(0), H = shape.hidden, D = shape.head_dim, L = static_cast<int64_t>(layers.size());
    require(positions.ndim() == 1 && positions.shape(0) == q && is_i64(positions) && c_contig(positions),
            "positions must be C-contiguous int64 [q], one per id");
    require(cos_table.ndim() == 2 && sin_table.ndim() == 2 && is_f32(cos_table) && is_f32(sin_table) &&
                c_contig(cos_table) && c_contig(sin_table) && cos_table.shape(1) == D && sin_table.shape(1) == D &&
                cos_table.shape(0) == sin_table.shape(0),
            "the RoPE tables must be C-contiguous float32 [positions, head_dim], cos and sin alike");
    const int64_t* idp = static_cast<const int64_t*>(ids.data());
    const int64_t* pp = static_cast<const int64_t*>(positions.data());
    for (int64_t i = 0; i < q; ++i) {
      require(idp[i] >= 0 && idp[i] < vocab, "token id " + std::to_string(idp[i]) + " is outside the vocabulary of " +
                                                 std::to_string(vocab));
      require(pp[i] >= 0 && pp[i] < cos_table.shape(0), "position " + std::to_string(pp[i]) +
                                                            " is past the RoPE tables' " +
                                                            std::to_string(cos_table.shape(0)) + " rows");
    }
    for (size_t k = 0; k < aux_layers.size(); ++k)
      require(aux_layers[k] >= 0 && aux_layers[k] <= L, "aux layer " + std::to_string(aux_layers[k]) +
                                                            " is outside 0.." + std::to_string(L));
    float* auxp = nullptr;
    py::array aux_arr;
    if (!aux_layers.empty()) {
      require(!aux_out.is_none(), "aux_layers needs an aux_out array");
      aux_arr = aux_out.cast<py::array>();
      require(aux_arr.ndim() == 2 && aux_arr.shape(0) == q &&
                  aux_arr.shape(1) == static_cast<int64_t>(aux_layers.size()) * H && is_f32(aux_arr) &&
                  c_contig(aux_arr) && aux_arr.writeable(),
              "aux_out must be writeable C-contiguous float32 [q, len(aux_layers) * hidden]");
      auxp = static_cast<float*>(aux_arr.mutable_data());
    }
    float* outp = nullptr;
    int64_t out_rows = 0;
    py::array out_arr;
    if (!out.is_none()) {
      out_arr = out.cast<py::array>();
      require(out_arr.ndim() == 2 && (out_arr.shape(0) == q || (q > 0 && out_arr.shape(0) == 1)) && out_arr.shape(1) == H &&
                  is_f32(out_arr) && c_contig(out_arr) && out_arr.writeable(),
              "out must be writeable C-contiguous float32 [q, hidden] or [1, hidden] (the last row)");
      outp = static_cast<float*>(out_arr.mutable_data());
      out_rows = out_arr.shape(0);
    }
    const int64_t k_rows = static_cast<int64_t>(head_rows.size());
    float* logp = nullptr;
    py::array log_arr;
    if (k_rows > 0) {
      require(outp != nullptr, "head_rows needs out (the final-normed rows the LM head reads)");
      for (int64_t r : head_rows)
        require(r >= 0 && r < out_rows, "head row " + std::to_string(r) + " is outside out's " +
                                            std::to_string(out_rows) + " rows");
      require(!logits.is_none(), "head_rows needs a logits array");
      log_arr = logits.cast<py::array>();
      require(log_arr.ndim() == 2 && log_arr.shape(0) == k_rows && log_arr.shape(1) == head_vocab &&
                  is_f32(log_arr) && c_contig(log_arr) && log_arr.writeable(),
              "logits must be writeable C-contiguous float32 [len(head_rows), " + std::to_string(head_vocab) + "]");
      logp = static_cast<float*>(log_arr.mutable_data());
    }
    py::array mask;   // keeps the mask alive while the step runs
    const uint8_t* mp = checked_step(cache, allowed, q, start, threads, &mask);
    const float* ct = static_cast<const float*>(cos_table.data());
    const float* st = static_cast<const float*>(sin_table.data());
    py::gil_scoped_release release;
    if (q == 0) return;
    thread_local std::vector<float> h, cs, sn;
    h.resize(static_cast<size_t>(q * H));
    cs.resize(static_cast<size_t>(q * D));
    sn.resize(static_cast<size_t>(q * D));
    for (int64_t i = 0; i < q; ++i) {
      float* row = h.data() + i * H;
      if (shape.bf16_weights) {   // bf16 to float32 exactly: the bits in the high half
        const uint16_t* e = static_cast<const uint16_t*>(embed) + idp[i] * H;
        for (int64_t c = 0; c < H; ++c) {
          const uint32_t bits = static_cast<uint32_t>(e[c]) << 16;
          std::memcpy(row + c, &bits, sizeof(float));
        }
      } else {
        std::copy_n(static_cast<const float*>(embed) + idp[i] * H, H, row);
      }
      std::copy_n(ct + pp[i] * D, D, cs.data() + i * D);
      std::copy_n(st + pp[i] * D, D, sn.data() + i * D);
    }
    // Stop at each aux layer (in increasing order) to copy the hidden states entering it.
    std::vector<int64_t> stops(aux_layers.begin(), aux_layers.end());
    stops.push_back(L);
    std::sort(stops.begin(), stops.end());
    stops.erase(std::unique(stops.begin(), stops.end()), stops.end());
    // The rows whose last-layer output anyone reads: none for a prompt's inner chunk (out is None), the last for
    // its last chunk (out of one row), every row for a tree or aux features after the last layer. The others stop
    // in the last layer once their K/V are written (a 600-token prompt: 1/30 of its layers' work).
    const bool aux_after_last = std::find(aux_layers.begin(), aux_layers.end(), L) != aux_layers.end();
    const int64_t tail_from = aux_after_last ? 0 : !outp ? q : out_rows == 1 ? q - 1 : 0;
    int64_t begin = 0;
    for (int64_t stop : stops) {
      if (stop > begin) {
        dart::decoder_layers(shape, layers, cache.layers, cache.capacity, begin, stop, h.data(), q, cs.data(),
                             sn.data(), mp, start, threads, stop == L ? tail_from : 0);
        begin = stop;
      }
      for (size_t k = 0; k < aux_layers.size(); ++k)
        if (aux_layers[k] == stop)
          for (int64_t i = 0; i < q; ++i)
            std::copy_n(h.data() + i * H, H, auxp + (i * static_cast<int64_t>(aux_layers.size()) + k) * H);
    }
    if (outp) {
      const float* from = h.data() + (out_rows == q ? 0 : (q - 1) * H);
      dart::ops::rms_norm(from, final_norm, outp, out_rows, H, shape.eps);
    }
    if (logp) {
      thread_local std::vector<float> x;
      x.resize(static_cast<size_t>(k_rows * H));
      for (int64_t r = 0; r < k_rows; ++r) std::copy_n(outp + head_rows[r] * H, H, x.data() + r * H);
      if (lm_head_bf16)
        dart::small_gemm_bf16(x.data(), static_cast<const uint16_t*>(lm_head), logp, k_rows, head_vocab, H, threads);
      else
        dart::small_gemm_f32(x.data(), static_cast<const float*>(lm_head), logp, k_rows, head_vocab, H, threads);
    }
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
      .def("set_ends", &PyDecoder::set_ends, py::arg("embed"), py::arg("final_norm"), py::arg("lm_head"),
           "Bind the token embedding table [vocab, hidden] (the layers' weight dtype), the final norm's weight and "
           "the LM head [vocab, hidden] (bfloat16 bits or float32).")
      .def("forward", &PyDecoder::forward, py::arg("ids"), py::arg("positions"), py::arg("cos_table"),
           py::arg("sin_table"), py::arg("allowed"), py::arg("start"), py::arg("cache"), py::arg("aux_layers"),
           py::arg("aux_out"), py::arg("out"), py::arg("head_rows"), py::arg("logits"), py::arg("threads"),
           "One step or prompt chunk in one call: embedding rows, every layer, aux features, the final norm "
           "(out: [q, hidden], [1, hidden] for the last row, or None) and the LM head of out's head_rows.")
      .def_property_readonly("num_layers", [](const PyDecoder& d) { return d.layers.size(); })
      .def_property_readonly(
          "fused", [](const PyDecoder& d) {
            std::vector<std::pair<bool, bool>> out;
            for (const auto& w : d.layers) out.emplace_back(w.qkv_adjacent, w.gate_up_adjacent);
            return out;
          },
          "Per layer: (q/k/v run as one GEMM call, gate/up run as one): where their weights lie back to back.");
}
