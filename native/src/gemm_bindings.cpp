// Python bindings of the small GEMM (small_gemm.hpp): the product, its path choice and knobs, the sweep the load-time
// kernel choice times, and the read-bandwidth probe (stream_read.hpp).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "binding_checks.hpp"
#include "small_gemm.hpp"
#include "stream_read.hpp"

namespace py = pybind11;

namespace {

using dart_bindings::c_contig;
using dart_bindings::is_f32;
using dart_bindings::is_u16;
using dart_bindings::overlaps;

// The small-GEMM path of that name; ValueError naming the caller and the known names for any other.
dart::GemmPath path_named(const std::string& name, const char* caller) {
  dart::GemmPath p;
  if (!dart::small_gemm_path_from_name(name, &p))
    throw py::value_error(std::string(caller) + ": '" + name + "' is not one of amx, avx512bf16, avx512, avx2, portable");
  return p;
}

// y = x @ w^T into a caller-owned y; every array must already have the right dtype and be
// C-contiguous (no silent copies: the caller packs weights once, at load time).
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

}  // namespace

void bind_small_gemm(py::module_& m) {
  m.def("small_gemm", &small_gemm_checked, py::arg("x"), py::arg("w"), py::arg("y"), py::arg("threads") = 1,
        "y = x @ w.T for float32 x [M, K] and w [N, K] (float32, or uint16 holding bfloat16), written into "
        "float32 y [M, N]. Reads w once for all M rows; see native/src/small_gemm.hpp.");
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
  m.def("small_gemm_set_split", &dart::small_gemm_set_split, py::arg("items_per_thread"),
        "How every later small-GEMM call cuts its weight rows among the threads: 0 (default) chunks of ~48 KiB "
        "claimed in order, k in 1-64 equal ranges per thread. The same results at any value; "
        "dart_core.models.gemm_split times which is faster on this machine.");
  m.def("small_gemm_split", &dart::small_gemm_split, "The items per thread small_gemm_set_split set (0: chunks).");
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
}
