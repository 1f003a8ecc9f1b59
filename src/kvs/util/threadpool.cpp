#include "kvs/util/threadpool.h"

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace kvs {
namespace {

thread_local bool t_in_region = false;

}  // namespace

ThreadPool::ThreadPool(int n_threads, std::vector<int> cpus)
    : n_threads_(n_threads < 1 ? 1 : n_threads) {
  for (int t = 1; t < n_threads_; ++t) {
    const int cpu = static_cast<size_t>(t) < cpus.size() ? cpus[static_cast<size_t>(t)] : -1;
    threads_.emplace_back([this, t, cpu] {
      if (cpu >= 0) pin_this_thread(cpu);
      worker(t);
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  for (auto& th : threads_) th.join();
}

void ThreadPool::worker(int tid) {
  uint64_t seen = 0;
  for (;;) {
    // Spin a little: parallel regions in a decode step come microseconds apart.
    auto start = std::chrono::steady_clock::now();
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen) {
      _mm_pause();
      if (++spins % 1024 == 0 &&
          std::chrono::steady_clock::now() - start > std::chrono::microseconds(200)) {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
        break;
      }
    }
    seen = generation_.load(std::memory_order_acquire);
    const std::function<void(int, int)>* job;
    bool claimed;
    {
      // A worker that wakes after the caller has finished an optional job (parallel_for hands
      // out work dynamically) skips it instead of being waited for.
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      job = job_;
      claimed = claims_ > 0;
      if (claimed) --claims_;
    }
    if (!claimed) continue;
    t_in_region = true;
    (*job)(tid, n_threads_);
    t_in_region = false;
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
  run_impl(fn, false);
}

void ThreadPool::run_impl(const std::function<void(int, int)>& fn, bool optional) {
  if (n_threads_ == 1 || t_in_region) {
    fn(0, 1);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    pending_.store(n_threads_ - 1, std::memory_order_release);
    claims_ = n_threads_ - 1;
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  t_in_region = true;
  fn(0, n_threads_);
  t_in_region = false;
  if (optional) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.fetch_sub(claims_, std::memory_order_acq_rel);
    claims_ = 0;
  }
  // Wait for the workers that took part; yield now and then so a descheduled worker on a busy
  // machine gets the core back.
  for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < 4096)
      _mm_pause();
    else
      std::this_thread::yield();
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  if (n <= grain || n_threads_ == 1 || t_in_region) {
    fn(0, n);
    return;
  }
  std::atomic<int64_t> next{0};
  run_impl(
      [&](int, int) {
        for (;;) {
          int64_t b = next.fetch_add(grain, std::memory_order_relaxed);
          if (b >= n) break;
          fn(b, b + grain < n ? b + grain : n);
        }
      },
      true);
}

namespace {
std::unique_ptr<ThreadPool>& pool_slot() {
  static std::unique_ptr<ThreadPool> p;
  return p;
}
std::mutex& pool_mu() {
  static std::mutex m;
  return m;
}
}  // namespace

int hardware_threads() {
  const unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : static_cast<int>(hc);
}

std::vector<int> allowed_cpus() {
  std::vector<int> r;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) r.push_back(c);
  }
  if (r.empty())
    for (int c = 0; c < hardware_threads(); ++c) r.push_back(c);
  return r;
}

bool pin_this_thread(int cpu) {
  if (cpu < 0 || cpu >= CPU_SETSIZE) return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

int default_thread_count() {
  if (const char* e = std::getenv("KVS_THREADS")) {
    int n = std::atoi(e);
    if (n > 0) return std::min(n, hardware_threads());
  }
  return hardware_threads();
}

ThreadPool& thread_pool() {
  std::lock_guard<std::mutex> lock(pool_mu());
  auto& p = pool_slot();
  if (!p) p = std::make_unique<ThreadPool>(default_thread_count());
  return *p;
}

void set_thread_count(int n) {
  std::lock_guard<std::mutex> lock(pool_mu());
  auto& p = pool_slot();
  n = n <= 0 ? default_thread_count() : std::min(n, hardware_threads());
  if (p && p->size() == n) return;
  p = std::make_unique<ThreadPool>(n);
}

void copy_on_pool(const std::vector<PoolCopy>& copies) {
  thread_pool().parallel_for(static_cast<int64_t>(copies.size()), 4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const PoolCopy& c = copies[static_cast<size_t>(i)];
      std::memcpy(c.dst, c.src, c.n);
    }
  });
}

}  // namespace kvs
