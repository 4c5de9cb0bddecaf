// See thread_pool.hpp.
#include "thread_pool.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define DART_X86 1
#endif
#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#define DART_PTHREAD 1
#endif

namespace dart {
namespace {

// ---- the thread pool of parallel_items -------------------------------------------------------------------------
// One job at a time. state packs the job's generation (24 bits), its thread count (8), its item count (16) and the
// next unclaimed item (16): a worker claims item i of generation g by one compare-exchange from (g, t, n, i) to
// (g, t, n, i + 1), so it can never claim an item of a job that has ended (the generation differs) and reads the job
// (fn, ctx) only after a successful claim, while the caller still waits for that item. Idle workers spin for
// DART_POOL_SPIN_US microseconds (default 300: longer than the gaps between a decoding step's GEMMs), then sleep.
class Pool {
 public:
  void run(int threads, int64_t total, void (*fn)(void*, int64_t), void* ctx) {
    std::unique_lock<std::mutex> busy(call_mutex_, std::try_to_lock);
    if (!busy.owns_lock()) {   // another thread's call is in flight: run this one here
      for (int64_t i = 0; i < total; ++i) fn(ctx, i);
      return;
    }
    threads = std::min(threads, 255);
    while (static_cast<int>(workers_) < threads - 1) {
      std::thread(&Pool::worker, this, static_cast<int>(workers_)).detach();
      ++workers_;
    }
    fn_ = fn;
    ctx_ = ctx;
    done_.store(0, std::memory_order_relaxed);
    gen_ = (gen_ + 1) & 0xFFFFFFu;
    state_.store((static_cast<uint64_t>(gen_) << 40) | (static_cast<uint64_t>(threads) << 32) |
                 (static_cast<uint64_t>(total) << 16), std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      { std::lock_guard<std::mutex> lock(sleep_mutex_); }
      wake_.notify_all();
    }
    int64_t mine = 0;
    work(gen_, &mine);
    while (done_.load(std::memory_order_acquire) + mine < total) pause();
  }

 private:
  static uint32_t gen_of(uint64_t s) { return static_cast<uint32_t>(s >> 40); }
  static int threads_of(uint64_t s) { return static_cast<int>((s >> 32) & 0xFF); }
  static int64_t total_of(uint64_t s) { return static_cast<int64_t>((s >> 16) & 0xFFFF); }
  static int64_t next_of(uint64_t s) { return static_cast<int64_t>(s & 0xFFFF); }
  static void pause() {
#ifdef DART_X86
    _mm_pause();
#else
    std::this_thread::yield();
#endif
  }

  // Claims and runs items of generation gen until none is left; counts them in *ran (the caller) or done_.
  void work(uint32_t gen, int64_t* ran) {
    uint64_t s = state_.load(std::memory_order_acquire);
    while (gen_of(s) == gen && next_of(s) < total_of(s)) {
      if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      fn_(ctx_, next_of(s));
      if (ran) ++*ran;
      else done_.fetch_add(1, std::memory_order_release);
      s = state_.load(std::memory_order_acquire);
    }
  }

  void worker(int id) {
    uint32_t seen = gen_of(state_.load(std::memory_order_acquire));
    const auto spin = std::chrono::microseconds(spin_us());
    for (;;) {
      uint64_t s = state_.load(std::memory_order_acquire);
      if (gen_of(s) == seen) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0;; ++i) {
          pause();
          s = state_.load(std::memory_order_acquire);
          if (gen_of(s) != seen) break;
          if ((i & 255) == 255 && std::chrono::steady_clock::now() - t0 > spin) {
            std::unique_lock<std::mutex> lock(sleep_mutex_);
            sleepers_.fetch_add(1, std::memory_order_seq_cst);
            wake_.wait(lock, [&] { return gen_of(state_.load(std::memory_order_seq_cst)) != seen; });
            sleepers_.fetch_sub(1, std::memory_order_seq_cst);
            s = state_.load(std::memory_order_acquire);
            break;
          }
        }
      }
      seen = gen_of(s);
      if (id < threads_of(s) - 1) work(seen, nullptr);
    }
  }

  static long spin_us() {
    const char* v = std::getenv("DART_POOL_SPIN_US");
    return v ? std::max(0L, std::atol(v)) : 300L;
  }

  std::mutex call_mutex_;
  unsigned workers_ = 0;
  uint32_t gen_ = 0;
  void (*fn_)(void*, int64_t) = nullptr;
  void* ctx_ = nullptr;
  std::atomic<uint64_t> state_{0};
  std::atomic<int64_t> done_{0};
  std::atomic<int> sleepers_{0};
  std::mutex sleep_mutex_;
  std::condition_variable wake_;
};

// Never destroyed (detached workers may still wait on it at exit); a forked child starts a new one (the parent's
// workers do not exist there, and its mutexes may be held).
Pool* the_pool = nullptr;
std::once_flag pool_once;
Pool& pool() {
  std::call_once(pool_once, [] {
    the_pool = new Pool();
#ifdef DART_PTHREAD
    pthread_atfork(nullptr, nullptr, [] { the_pool = new Pool(); });
#endif
  });
  return *the_pool;
}

}  // namespace

void parallel_items(int threads, int64_t total, void (*fn)(void*, int64_t), void* ctx) {
  thread_local bool inside = false;   // a nested call (from an item) runs on its own thread
  if (threads <= 1 || total <= 1 || inside) {
    for (int64_t i = 0; i < total; ++i) fn(ctx, i);
    return;
  }
  if (total >= 65536) throw std::invalid_argument("parallel_items: total must be < 65536");
  inside = true;
  try {
    pool().run(threads, total, fn, ctx);
  } catch (...) {
    inside = false;
    throw;
  }
  inside = false;
}

}  // namespace dart
