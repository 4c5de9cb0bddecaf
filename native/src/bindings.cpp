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
#include "trie_import.hpp"

namespace py = pybind11;
using dart::NgramStore;

void bind_small_gemm(py::module_& m);   // gemm_bindings.cpp
void bind_decoder(py::module_& m);   // decoder_bindings.cpp
void bind_head_step(py::module_& m);   // head_bindings.cpp
void bind_context_index(py::module_& m);   // context_bindings.cpp

namespace {

using dart_bindings::c_contig;
using dart_bindings::is_f32;

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
  bind_small_gemm(m);
  bind_decoder(m);
  bind_head_step(m);
  bind_context_index(m);
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
      "prune_dart_chains",
      [](py::array logits, py::array tokens, py::array tails, const NgramStore* store, py::array eos,
         py::object config) {
        auto lg = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(logits);
        auto tk = IdArray::ensure(tokens);
        auto tl = IdArray::ensure(tails);
        auto ev = IdArray::ensure(eos);
        if (!lg || !tk || !tl || !ev) throw py::type_error("prune_dart_chains: inputs must be numeric arrays");
        if (lg.ndim() != 3 || tk.ndim() != 3 || lg.shape(0) != tk.shape(0) || lg.shape(1) != tk.shape(1) ||
            lg.shape(2) != tk.shape(2) || lg.shape(1) < 1 || lg.shape(2) < 1)
          throw py::value_error("prune_dart_chains: topk_logits and topk_tokens must both be [B, L, k] (L, k >= 1) "
                                "with the same shape");
        if (tl.ndim() != 2 || tl.shape(0) != lg.shape(0) || tl.shape(1) < 1)
          throw py::value_error("prune_dart_chains: tails must be [B, T] (T >= 1): one row a request, the root last");
        const size_t B = static_cast<size_t>(lg.shape(0)), L = static_cast<size_t>(lg.shape(1)),
                     k = static_cast<size_t>(lg.shape(2)), T = static_cast<size_t>(tl.shape(1));
        const int64_t* tp = tl.data();
        for (size_t b = 0; b < B; ++b) {
          if (tp[b * T + T - 1] < 0)
            throw py::value_error("prune_dart_chains: request " + std::to_string(b) +
                                  "'s tail ends with an unknown token (-1): its last entry must be the root");
          if (store != nullptr)
            for (size_t j = 0; j < T; ++j)
              if (tp[b * T + j] >= static_cast<int64_t>(store->header().vocab_size))
                throw py::value_error("prune_dart_chains: tails hold token id " + std::to_string(tp[b * T + j]) +
                                      ", outside the table's vocabulary [0, " +
                                      std::to_string(store->header().vocab_size) +
                                      "); was the table built for another tokenizer?");
        }
        if (store != nullptr) checked_ids(tk, store->header().vocab_size, "topk_tokens");
        auto params = params_from(config);
        py::array_t<int64_t> out({static_cast<py::ssize_t>(B), static_cast<py::ssize_t>(L)});
        int64_t* o = out.mutable_data();
        const float* lp = lg.data();
        const int64_t* kp = tk.data();
        {
          py::gil_scoped_release release;
          for (size_t b = 0; b < B; ++b) {
            const int64_t* row = tp + b * T;
            size_t start = 0;   // the known tokens after the last unknown one
            for (size_t j = 0; j < T; ++j)
              if (row[j] < 0) start = j + 1;
            const dart::PruneResult r = dart::prune_tree(lp + b * L * k, kp + b * L * k, L, k, row + start, T - start,
                                                         store, ev.data(), static_cast<size_t>(ev.size()), params);
            for (size_t level = 0; level < L; ++level) {
              int64_t best = -1;   // the first of equal scores, as numpy's argmax
              for (size_t i = 0; i < r.token.size(); ++i)
                if (r.depth[i] == static_cast<int64_t>(level) + 1 && (best < 0 || r.score[i] > r.score[best]))
                  best = static_cast<int64_t>(i);
              if (best >= 0) {
                o[b * L + level] = r.token[static_cast<size_t>(best)];
              } else {   // every candidate of the level before was an EOS: the row's best by logit stands in
                const float* lr = lp + (b * L + level) * k;
                size_t at = 0;
                for (size_t c = 1; c < k; ++c)
                  if (lr[c] > lr[at]) at = c;
                o[b * L + level] = kp[(b * L + level) * k + at];
              }
            }
          }
        }
        return out;
      },
      py::arg("topk_logits"), py::arg("topk_tokens"), py::arg("tails"), py::arg("store").none(true),
      py::arg("eos_token_ids"), py::arg("config"),
      "DART's chains for a batch of requests in one call (dart_core/drafters/chain.py): topk_logits / topk_tokens "
      "[B, L, k], tails [B, T] int64 (each request's context tail, the root last, -1 where unknown), config a chain "
      "search's PruningConfig (beam 1, every candidate kept). Returns [B, L] int64: per request and level, the "
      "best-scored candidate of that level (the first of equal scores), or the row's best by logit where the level has "
      "none.");

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
