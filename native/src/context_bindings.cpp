// Python binding of ContextIndex (context_index.hpp): the live context DART's pruner drafts from.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "context_index.hpp"

namespace py = pybind11;

namespace {

using IdArray = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

// 1-D int64 ids checked against the index's vocabulary, as uint32 (the index's id type).
std::vector<uint32_t> index_ids(const IdArray& a, const dart::ContextIndex& ix, const char* what) {
  if (a.ndim() != 1) throw py::value_error(std::string(what) + " must be a 1-D sequence of token ids");
  const int64_t* p = a.data();
  std::vector<uint32_t> out(static_cast<size_t>(a.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    if (p[i] < 0 || static_cast<uint64_t>(p[i]) >= ix.vocab_size()) {
      throw py::value_error(std::string(what) + " holds token id " + std::to_string(p[i]) + " at position " +
                            std::to_string(i) + ", outside the vocabulary [0, " + std::to_string(ix.vocab_size()) +
                            ") the context index was made for");
    }
    out[i] = static_cast<uint32_t>(p[i]);
  }
  return out;
}

template <class T>
py::array_t<int64_t> as_int64(const std::vector<T>& v) {
  py::array_t<int64_t> out(static_cast<py::ssize_t>(v.size()));
  for (size_t i = 0; i < v.size(); ++i) out.mutable_data()[i] = static_cast<int64_t>(v[i]);
  return out;
}

}  // namespace

void bind_context_index(py::module_& m) {
  py::class_<dart::ContextIndex>(m, "ContextIndex",
                                 "N-gram counts of one request's committed tokens (context_index.hpp).")
      .def(py::init([](int64_t max_order, int64_t vocab_size) {
             if (max_order < 1 || max_order > 64) throw py::value_error("ContextIndex: max_order must be in [1, 64]");
             if (vocab_size < 1 || vocab_size > static_cast<int64_t>(UINT32_MAX)) {
               throw py::value_error("ContextIndex: vocab_size must be in [1, 2^32 - 1]");
             }
             return new dart::ContextIndex(static_cast<size_t>(max_order), static_cast<uint64_t>(vocab_size));
           }),
           py::arg("max_order"), py::arg("vocab_size"))
      .def_property_readonly("max_order", &dart::ContextIndex::max_order, "Longest suffix counted (tokens).")
      .def_property_readonly("vocab_size", &dart::ContextIndex::vocab_size, "Ids must lie below it.")
      .def("__len__", &dart::ContextIndex::size, "Tokens indexed.")
      .def("reset", &dart::ContextIndex::reset, "Forget every token (a new request).")
      .def(
          "extend",
          [](dart::ContextIndex& ix, const IdArray& tokens) {
            if (tokens.ndim() != 1) throw py::value_error("tokens must be a 1-D sequence of token ids");
            try {
              ix.extend(tokens.data(), static_cast<size_t>(tokens.size()));
            } catch (const std::invalid_argument& e) {
              throw py::value_error(e.what());
            }
          },
          py::arg("tokens"), "Append committed tokens (all checked first: a bad id leaves the index unchanged).")
      .def(
          "query",
          [](const dart::ContextIndex& ix, const IdArray& context, const IdArray& candidates) {
            auto ctx = index_ids(context, ix, "context");
            auto cand = index_ids(candidates, ix, "candidates");
            py::array_t<double> probs(static_cast<py::ssize_t>(cand.size()));
            py::array_t<int32_t> matched(static_cast<py::ssize_t>(cand.size()));
            ix.query(ctx.data(), ctx.size(), cand.data(), cand.size(), probs.mutable_data(), matched.mutable_data());
            return py::make_tuple(probs, matched);
          },
          py::arg("context"), py::arg("candidates"),
          "P(candidate | context) with the N-gram table's back-off over the request's own tokens, and the matched "
          "suffix length (0: never seen, P = 0). Returns (probs float64 [n], matched int32 [n]).")
      .def(
          "continuations",
          [](const dart::ContextIndex& ix, const IdArray& context, int64_t max_children) {
            if (max_children < 0) throw py::value_error("max_children must be >= 0");
            auto ctx = index_ids(context, ix, "context");
            auto c = ix.continuations(ctx.data(), ctx.size(), static_cast<size_t>(max_children));
            return py::make_tuple(c.matched, c.context_count, as_int64(c.tokens), as_int64(c.counts));
          },
          py::arg("context"), py::arg("max_children"),
          "What followed the longest suffix of context seen before: (matched_len, context_count, tokens, counts), "
          "most frequent first, ties most recent first.")
      .def(
          "tokens", [](const dart::ContextIndex& ix) { return as_int64(ix.tokens()); },
          "The indexed tokens, in order.");
}
