// Argument checks shared by the Python bindings (bindings.cpp, head_bindings.cpp): array dtypes and layout,
// and size products that must fit an int64. Errors are ValueErrors that start with the caller's prefix.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

namespace dart_bindings {

namespace py = pybind11;

inline bool is_f32(const py::array& a) { return a.dtype().is(py::dtype::of<float>()); }
inline bool is_u16(const py::array& a) { return a.dtype().is(py::dtype::of<uint16_t>()); }
inline bool is_i64(const py::array& a) { return a.dtype().is(py::dtype::of<int64_t>()); }
inline bool c_contig(const py::array& a) { return (a.flags() & py::array::c_style) != 0; }

// Whether two C-contiguous arrays share a byte (an empty array shares none).
inline bool overlaps(const py::array& a, const py::array& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  const auto a0 = reinterpret_cast<uintptr_t>(a.data()), b0 = reinterpret_cast<uintptr_t>(b.data());
  return a0 < b0 + static_cast<uintptr_t>(b.nbytes()) && b0 < a0 + static_cast<uintptr_t>(a.nbytes());
}

// a * b for positive sizes (from a config file), refused when the product does not fit in int64.
inline int64_t checked_mul(int64_t a, int64_t b, const std::string& prefix, const char* what) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out))
    throw py::value_error(prefix + what + " (" + std::to_string(a) + " x " + std::to_string(b) +
                          ") overflows 64 bits; check the model config's sizes");
  return out;
}

}  // namespace dart_bindings
