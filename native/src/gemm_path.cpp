// Which small-GEMM path a call runs (see small_gemm.hpp): this CPU's best, the default by vendor, DART_GEMM_PATH,
// or a path a caller forced.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "gemm_kernels.hpp"
#include "small_gemm.hpp"

namespace dart {
namespace {

// The forced path (-1: none, use DART_GEMM_PATH or the best).
std::atomic<int> forced_path{-1};


GemmPath clamp_to_cpu(GemmPath want) {
  return static_cast<GemmPath>(std::min(static_cast<int>(want), static_cast<int>(small_gemm_best_path())));
}

// DART_GEMM_PATH, read once: the path it names (clamped to this CPU), or the default when it names none.
struct EnvPath {
  GemmPath path;
  bool named;   // the variable named a path (not unset, "auto" or unknown)
};

const EnvPath& env_choice() {
  static const EnvPath e = [] {
    const char* v = std::getenv("DART_GEMM_PATH");
    const std::string name = v ? v : "";
    if (name.empty() || name == "auto") return EnvPath{small_gemm_default_path(), false};
    GemmPath q;
    if (small_gemm_path_from_name(name, &q)) return EnvPath{clamp_to_cpu(q), true};
    std::fprintf(stderr, "DART_GEMM_PATH=%s is not one of amx, avx512bf16, avx512, avx2, portable, auto: ignored\n", v);
    return EnvPath{small_gemm_default_path(), false};
  }();
  return e;
}

GemmPath env_path() { return env_choice().path; }

}  // namespace

bool small_gemm_has_avx2() {
#ifdef DART_X86
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
#else
  return false;
#endif
}

GemmPath small_gemm_best_path_for(bool avx2, bool avx512, bool avx512bf16, bool amx) {
  if (!avx2) return GemmPath::Portable;
  if (!avx512) return GemmPath::Avx2;
  if (!avx512bf16) return GemmPath::Avx512;
  return amx ? GemmPath::Amx : GemmPath::Avx512Bf16;
}

GemmPath small_gemm_best_path() {
#ifdef DART_X86
  static const GemmPath best = [] {
    // __builtin_cpu_supports also checks that the OS saves the zmm / ymm state (XGETBV).
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl");
    const bool bf16 = avx512 && __builtin_cpu_supports("avx512bf16");
    // The tiles are asked of the OS only where the AMX kernel could run (it needs AVX512-BF16 too).
    return small_gemm_best_path_for(small_gemm_has_avx2(), avx512, bf16, bf16 && gemm::amx_available());
  }();
  return best;
#else
  return GemmPath::Portable;
#endif
}

// "auto" runs AMX where it runs: measured on a 2-vCPU Intel Xeon with AMX (family 6, KVM), the bundled SmolLM2-135M
// in bf16, 2 threads, prefix 300 (tree_cost.py --paths amx,avx512bf16,avx512, one process, interleaved): one token
// 11.6 ms against 12.6 on avx512 and 11.5 on avx512bf16; trees of 3 / 9 / 17 nodes 13.7 / 17.0 / 22.8 ms against
// 14.5 / 20.3 / 29.8 (avx512) and 14.5 / 21.3 / 32.6 (avx512bf16).
// Without AMX, AVX512-BF16 is the default on AMD CPUs only. On a 2-vCPU AMD EPYC (Zen 5, family 26), same model and
// measurement, interleaved: trees of 3 / 5 / 9 / 17 nodes took 0.92 / 0.98 / 0.91 / 0.84x the avx512 path's time
// and one token 1.02x (a second run: 0.94 / 0.91 / 0.91 / 0.82x and 0.94x); bench_native.py --gemm --cold ran 5-64
// rows at 1.1-1.6x avx512's multiply-adds/s, 4 rows at 0.8-1.0x; the eval sets (python -m dart_core.bench, two runs
// a path) gave DART 141 tok/s against 136. On an Intel Emerald Rapids VM (model 207, no AMX) VDPBF16PS ran tree
// blocks (M >= 4) at 0.6-0.85x the float32 kernel's multiply-adds/s (one port there, FMAs on two) and whole verifies
// 0.93-1.06x avx512's time, so Intel CPUs without AMX keep the float32-activation path. Zen 4 (also AMD with
// AVX512-BF16) was not measured. The path is one per process: vanilla and every drafter run the same one.
GemmPath small_gemm_default_path_for(GemmPath best, bool amd) {
  return (best == GemmPath::Avx512Bf16 && !amd) ? GemmPath::Avx512 : best;
}

GemmPath small_gemm_default_path() {
#ifdef DART_X86
  static const bool amd = __builtin_cpu_is("amd");
#else
  const bool amd = false;
#endif
  return small_gemm_default_path_for(small_gemm_best_path(), amd);
}

GemmPath small_gemm_path() {
  const int f = forced_path.load(std::memory_order_relaxed);
  return f >= 0 ? static_cast<GemmPath>(f) : env_path();
}

const char* small_gemm_path_source() {
  if (forced_path.load(std::memory_order_relaxed) >= 0) return "set";
  return env_choice().named ? "DART_GEMM_PATH" : "default";
}

void small_gemm_release_path() { forced_path.store(-1, std::memory_order_relaxed); }

void small_gemm_set_path(GemmPath path) {
  if (static_cast<int>(path) > static_cast<int>(small_gemm_best_path()))
    throw std::invalid_argument(std::string("small_gemm: this CPU cannot run the ") + small_gemm_path_name(path) +
                                " path (best: " + small_gemm_path_name(small_gemm_best_path()) + ")");
  forced_path.store(static_cast<int>(path), std::memory_order_relaxed);
}

const char* small_gemm_path_name(GemmPath path) {
  switch (path) {
    case GemmPath::Amx: return "amx";
    case GemmPath::Avx512Bf16: return "avx512bf16";
    case GemmPath::Avx512: return "avx512";
    case GemmPath::Avx2: return "avx2";
    default: return "portable";
  }
}

bool small_gemm_path_from_name(const std::string& name, GemmPath* out) {
  for (GemmPath p : {GemmPath::Amx, GemmPath::Avx512Bf16, GemmPath::Avx512, GemmPath::Avx2, GemmPath::Portable})
    if (name == small_gemm_path_name(p)) {
      *out = p;
      return true;
    }
  return false;
}

}  // namespace dart
