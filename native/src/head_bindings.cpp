// Python binding of the draft heads' native step (head_step.hpp): class DraftHeadKernel. Checks every
// array and index at the boundary (ids index the embedding, slots index the cache), then runs without
// the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "binding_checks.hpp"
#include "head_step.hpp"

namespace py = pybind11;

namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw py::value_error("draft head kernel: " + what);
}

using dart_bindings::c_contig;
using dart_bindings::is_f32;
using dart_bindings::is_i64;
using dart_bindings::is_u16;

std::string dims(std::initializer_list<int64_t> d) {
  std::string s = "[";
  for (int64_t v : d) s += (s.size() > 1 ? ", " : "") + std::to_string(v);
  return s + "]";
}

// a * b for sizes from a config file (dart_bindings::checked_mul, this binding's prefix).
int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  return dart_bindings::checked_mul(a, b, "draft head kernel: ", what);
}

template <class T>
py::array_t<T> new_array(std::vector<py::ssize_t> shape) {
  return py::array_t<T>(shape);
}

struct PyDraftHeadKernel {
  dart::HeadShape shape;
  dart::HeadWeights w;
  std::vector<py::array> keep;   // the borrowed arrays, alive as long as the kernel

  PyDraftHeadKernel(int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t intermediate,
                    int64_t fc_in, int64_t draft_vocab, int64_t vocab, float eps, bool bf16_weights,
                    const py::dict& arrays) {
    for (int64_t v : {hidden, heads, kv_heads, head_dim, intermediate, fc_in, draft_vocab, vocab})
      require(v > 0, "every size must be positive");
    require(heads % kv_heads == 0, "heads must be a multiple of kv_heads");
    require(head_dim % 2 == 0, "head_dim " + std::to_string(head_dim) + " is odd; RoPE needs an even head_dim");
    require(draft_vocab <= vocab, "the draft vocabulary is larger than the target's");
    const int64_t qd = checked_mul(heads, head_dim, "heads x head_dim"),
                  kvd = checked_mul(kv_heads, head_dim, "kv_heads x head_dim"), X = checked_mul(2, hidden, "2 x hidden");
    checked_mul(vocab, hidden, "vocab x hidden");
    checked_mul(draft_vocab, hidden, "draft_vocab x hidden");
    checked_mul(intermediate, hidden, "intermediate x hidden");
    checked_mul(fc_in, hidden, "fc_in x hidden");
    shape.hidden = hidden;
    shape.heads = heads;
    shape.kv_heads = kv_heads;
    shape.head_dim = head_dim;
    shape.intermediate = intermediate;
    shape.fc_in = fc_in;
    shape.draft_vocab = draft_vocab;
    shape.vocab = vocab;
    shape.eps = eps;
    shape.bf16_weights = bf16_weights;
    w.fc = matrix(arrays, "fc", hidden, fc_in);
    w.q = matrix(arrays, "q", qd, X);
    w.k = matrix(arrays, "k", kvd, X);
    w.v = matrix(arrays, "v", kvd, X);
    w.o = matrix(arrays, "o", hidden, qd);
    w.gate = matrix(arrays, "gate", intermediate, hidden);
    w.up = matrix(arrays, "up", intermediate, hidden);
    w.down = matrix(arrays, "down", hidden, intermediate);
    w.lm_head = matrix(arrays, "lm_head", draft_vocab, hidden);
    w.hidden_norm = vec(arrays, "hidden_norm", hidden, false);
    w.input_norm = vec(arrays, "input_norm", hidden, false);
    w.post_norm = vec(arrays, "post_norm", hidden, false);
    w.norm = vec(arrays, "norm", hidden, false);
    w.mask_rep = vec(arrays, "mask_rep", X, true);
    w.inv_freq = vec(arrays, "inv_freq", head_dim / 2, false);
    // The embedding is the target's: bf16 or float32 whatever the head's weights are.
    require(arrays.contains("embed"), "arrays lack embed");
    py::array e = arrays["embed"].cast<py::array>();
    require((is_u16(e) || is_f32(e)) && e.ndim() == 2 && e.shape(0) == vocab && e.shape(1) == hidden && c_contig(e),
            "embed must be C-contiguous float32 or uint16 (bfloat16 bits) " + dims({vocab, hidden}));
    shape.bf16_embed = is_u16(e);
    keep.push_back(e);
    w.embed = e.data();
    require(arrays.contains("d2t"), "arrays lack d2t");
    py::array d = arrays["d2t"].cast<py::array>();
    require(is_i64(d) && d.ndim() == 1 && d.shape(0) == draft_vocab && c_contig(d),
            "d2t must be C-contiguous int64 " + dims({draft_vocab}));
    const int64_t* dp = static_cast<const int64_t*>(d.data());
    for (int64_t i = 0; i < draft_vocab; ++i)   // every draft id must map into the target's vocabulary
      require(dp[i] >= -i && dp[i] < vocab - i, "d2t maps draft id " + std::to_string(i) + " to target id " +
                                                      std::to_string(i + dp[i]) + ", outside [0, " +
                                                      std::to_string(vocab) + ")");
    keep.push_back(d);
    w.d2t = dp;
  }

  const void* matrix(const py::dict& d, const char* name, int64_t rows, int64_t cols) {
    require(d.contains(name), std::string("arrays lack ") + name);
    py::array a = d[name].cast<py::array>();
    require(shape.bf16_weights ? is_u16(a) : is_f32(a),
            std::string(name) + (shape.bf16_weights ? " must be uint16 (bfloat16 bits)" : " must be float32"));
    require(a.ndim() == 2 && a.shape(0) == rows && a.shape(1) == cols && c_contig(a),
            std::string(name) + " must be C-contiguous " + dims({rows, cols}));
    keep.push_back(a);
    return a.data();
  }
  const float* vec(const py::dict& d, const char* name, int64_t n, bool optional) {
    if (!d.contains(name) || d[name].is_none()) {
      require(optional, std::string("arrays lack ") + name);
      return nullptr;
    }
    py::array a = d[name].cast<py::array>();
    require(is_f32(a) && a.ndim() == 1 && a.shape(0) == n && c_contig(a),
            std::string(name) + " must be C-contiguous float32 " + dims({n}));
    keep.push_back(a);
    return static_cast<const float*>(a.data());
  }

  // The head cache's buffers, with room for slots [0, end).
  dart::HeadCacheView cache(py::array& keys, py::array& values, int64_t end) const {
    for (py::array* a : {&keys, &values})
      require(is_f32(*a) && a->ndim() == 3 && a->shape(0) == shape.kv_heads && a->shape(2) == shape.head_dim &&
                  c_contig(*a) && a->writeable(),
              "cache buffers must be writeable C-contiguous float32 [kv_heads, capacity, head_dim] = " +
                  dims({shape.kv_heads, -1, shape.head_dim}));
    require(keys.shape(1) == values.shape(1), "keys and values must have the same capacity");
    require(end <= keys.shape(1), "the step needs cache slots up to " + std::to_string(end) + " but the cache holds " +
                                      std::to_string(keys.shape(1)) + " (reserve it first)");
    require(!dart_bindings::overlaps(keys, values), "keys and values must be different, non-overlapping buffers");
    return {static_cast<float*>(keys.mutable_data()), static_cast<float*>(values.mutable_data()), keys.shape(1)};
  }

  // Rows of inputs [n, cols] float32, and token ids [n] in the target's vocabulary.
  const float* rows_of(const py::array& a, int64_t n, int64_t cols, const char* name) const {
    require(is_f32(a) && a.ndim() == 2 && a.shape(0) == n && a.shape(1) == cols && c_contig(a),
            std::string(name) + " must be C-contiguous float32 " + dims({n, cols}));
    return static_cast<const float*>(a.data());
  }
  const int64_t* ids_of(const py::array& a, const char* name) const {
    require(is_i64(a) && a.ndim() == 1 && c_contig(a), std::string(name) + " must be a C-contiguous int64 vector");
    const int64_t* p = static_cast<const int64_t*>(a.data());
    for (py::ssize_t i = 0; i < a.shape(0); ++i)
      require(p[i] >= 0 && p[i] < shape.vocab, std::string(name) + " holds token id " + std::to_string(p[i]) +
                                                   ", outside the target's vocabulary [0, " +
                                                   std::to_string(shape.vocab) + ")");
    return p;
  }
  int64_t checked_top_k(int64_t k) const {
    require(k >= 1 && k <= shape.draft_vocab,
            "top_k must lie in [1, " + std::to_string(shape.draft_vocab) + "], got " + std::to_string(k));
    return k;
  }

  py::tuple dart_step(const py::array& aux, const py::array& next_ids, py::array keys, py::array values,
                      int64_t start, int64_t levels, int64_t top_k, int threads) {
    require(w.mask_rep != nullptr, "this kernel has no mask_rep: it was built for an EAGLE-3 head");
    const int64_t* ids = ids_of(next_ids, "next_ids");
    const int64_t n = next_ids.shape(0);
    require(n >= 1, "a DART step needs n >= 1 new positions (the last one is the tree root's)");
    require(levels >= 1, "levels must be >= 1, got " + std::to_string(levels));
    require(start >= 0 && levels <= std::numeric_limits<int64_t>::max() / 4 - n - start, "start or levels out of range");
    require(threads >= 1, "threads must be >= 1");
    const float* a = rows_of(aux, n, shape.fc_in, "aux");
    const dart::HeadCacheView c = cache(keys, values, start + n + levels - 1);
    const int64_t k = checked_top_k(top_k);
    py::array_t<float> logits = new_array<float>({levels, shape.draft_vocab});
    py::array_t<float> vals = new_array<float>({levels, k});
    py::array_t<int64_t> toks = new_array<int64_t>({levels, k});
    dart::TopK top{vals.mutable_data(), toks.mutable_data(), k};
    float* lp = logits.mutable_data();
    {
      py::gil_scoped_release release;
      dart::dart_head_step(shape, w, c, a, ids, n, start, levels, lp, top, threads);
    }
    return py::make_tuple(vals, toks, logits);
  }

  py::tuple eagle3_real(const py::array& aux, const py::array& next_ids, py::array keys, py::array values,
                        int64_t start, int64_t top_k, int threads) {
    const int64_t* ids = ids_of(next_ids, "next_ids");
    const int64_t n = next_ids.shape(0);
    require(n >= 1, "the real step needs n >= 1 new positions");
    require(start >= 0 && start <= std::numeric_limits<int64_t>::max() / 4 - n, "start out of range");
    require(threads >= 1, "threads must be >= 1");
    const float* a = rows_of(aux, n, shape.fc_in, "aux");
    const dart::HeadCacheView c = cache(keys, values, start + n);
    const int64_t k = checked_top_k(top_k);
    py::array_t<float> g = new_array<float>({1, shape.hidden});
    py::array_t<float> logp = new_array<float>({1, shape.draft_vocab});
    py::array_t<float> vals = new_array<float>({1, k});
    py::array_t<int64_t> toks = new_array<int64_t>({1, k});
    dart::TopK top{vals.mutable_data(), toks.mutable_data(), k};
    float* gp = g.mutable_data();
    float* lp = logp.mutable_data();
    {
      py::gil_scoped_release release;
      dart::eagle3_real_step(shape, w, c, a, ids, n, start, gp, lp, top, threads);
    }
    return py::make_tuple(g, logp, vals, toks);
  }

  py::tuple eagle3_tree(const py::array& h, const py::array& ids_arr, py::array keys, py::array values,
                        int64_t position, int64_t real, int64_t tree_start, const py::array& tree_allowed,
                        int64_t top_k, int threads) {
    const int64_t* ids = ids_of(ids_arr, "ids");
    const int64_t n = ids_arr.shape(0);
    require(n >= 1, "a tree step needs n >= 1 frontier nodes");
    require(position >= 0 && real >= 0 && tree_start >= real,
            "position, real and tree_start must satisfy 0 <= real <= tree_start");
    require(tree_start <= std::numeric_limits<int64_t>::max() / 4 - n,
            "tree_start " + std::to_string(tree_start) + " lies past any cache: the step needs slots up to "
            "tree_start + n");
    require(threads >= 1, "threads must be >= 1");
    const float* hp = rows_of(h, n, shape.hidden, "h");
    const int64_t width = tree_start - real + n;
    require(tree_allowed.itemsize() == 1 && tree_allowed.ndim() == 2 && tree_allowed.shape(0) == n &&
                tree_allowed.shape(1) == width && c_contig(tree_allowed),
            "tree_allowed must be a C-contiguous bool " + dims({n, width}) + " (this round's tree slots)");
    const dart::HeadCacheView c = cache(keys, values, tree_start + n);
    const int64_t k = checked_top_k(top_k);
    py::array_t<float> g = new_array<float>({n, shape.hidden});
    py::array_t<float> logp = new_array<float>({n, shape.draft_vocab});
    py::array_t<float> vals = new_array<float>({n, k});
    py::array_t<int64_t> toks = new_array<int64_t>({n, k});
    dart::TopK top{vals.mutable_data(), toks.mutable_data(), k};
    float* gp = g.mutable_data();
    float* lp = logp.mutable_data();
    const uint8_t* mp = static_cast<const uint8_t*>(tree_allowed.data());
    {
      py::gil_scoped_release release;
      dart::eagle3_tree_step(shape, w, c, hp, ids, n, position, real, tree_start, mp, gp, lp, top, threads);
    }
    return py::make_tuple(g, logp, vals, toks);
  }
};

}  // namespace

void bind_head_step(py::module_& m) {
  py::class_<PyDraftHeadKernel>(m, "DraftHeadKernel",
                                "A draft head's drafting forward in one native call (native/src/head_step.hpp).")
      .def(py::init<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, bool,
                    const py::dict&>(),
           py::arg("hidden"), py::arg("heads"), py::arg("kv_heads"), py::arg("head_dim"), py::arg("intermediate"),
           py::arg("fc_in"), py::arg("draft_vocab"), py::arg("vocab"), py::arg("eps"), py::arg("bf16_weights"),
           py::arg("arrays"))
      .def("dart_step", &PyDraftHeadKernel::dart_step, py::arg("aux"), py::arg("next_ids"), py::arg("keys"),
           py::arg("values"), py::arg("start"), py::arg("levels"), py::arg("top_k"), py::arg("threads") = 1,
           "DART: n real positions + levels-1 mask slots -> (top-k values [levels, k], target ids [levels, k], "
           "logits [levels, V_d]); K/V written at slots start..")
      .def("eagle3_real", &PyDraftHeadKernel::eagle3_real, py::arg("aux"), py::arg("next_ids"), py::arg("keys"),
           py::arg("values"), py::arg("start"), py::arg("top_k"), py::arg("threads") = 1,
           "EAGLE-3's real step -> (g [1, H] of the last row, log-probs [1, V_d], top-k [1, k], target ids [1, k])")
      .def("eagle3_tree", &PyDraftHeadKernel::eagle3_tree, py::arg("h"), py::arg("ids"), py::arg("keys"),
           py::arg("values"), py::arg("position"), py::arg("real"), py::arg("tree_start"), py::arg("tree_allowed"),
           py::arg("top_k"), py::arg("threads") = 1,
           "EAGLE-3's tree depth -> (g [n, H], log-probs [n, V_d], top-k [n, k], target ids [n, k])");
}
