#include "kvs/engine/split.h"

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include "kvs/backend/cpu/attention.h"
#include "kvs/backend/cpu/kernels.h"
#include "kvs/backend/cpu/span_attention.h"

namespace kvs {
namespace {

// The CPUs the calling thread may run on, in order.
std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> r;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return r;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) r.push_back(c);
  return r;
}

void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

}  // namespace

SplitWorker::SplitWorker(Device& dev, const KvLayout& kv, int32_t n_head, float scale,
                         int32_t threads)
    : dev_(dev), kv_(kv), n_head_(n_head), scale_(scale), pool_(threads) {
  // Each of the pool's threads on a CPU of its own, the last ones, where some are left over:
  // the first stay free for the thread issuing the device's work.
  const std::vector<int> cpus = allowed_cpus();
  const char* pin_env = std::getenv("KVS_SPLIT_PIN");
  const bool pinned =
      static_cast<int>(cpus.size()) > pool_.size() && !(pin_env && std::string(pin_env) == "0");
  const size_t first = cpus.size() - static_cast<size_t>(pool_.size());
  if (pinned)
    pool_.run([&](int tid, int) {
      if (tid > 0) pin(cpus[first + static_cast<size_t>(tid)]);
    });
  thread_ = std::thread([this, pinned, cpu = pinned ? cpus[first] : -1] {
    if (pinned) pin(cpu);
    loop();
  });
}

SplitWorker::~SplitWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void SplitWorker::post(SplitJob job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
}

double SplitWorker::busy_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_s_;
}

size_t SplitWorker::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

double SplitWorker::calibrate(size_t bytes) {
  const int32_t P = kv_.page_size;
  const size_t page = kv_.page_bytes();
  const int32_t n_pages = static_cast<int32_t>(std::max<size_t>(4, bytes / page));
  // One page of uniform rows in the cache's own quantization, copied into the others: the
  // kernels' work does not depend on the values, only on their types.
  const size_t kvd = static_cast<size_t>(kv_.n_head_kv) * static_cast<size_t>(kv_.head_dim);
  std::vector<float> k(static_cast<size_t>(P) * kvd), v(k.size());
  uint32_t x = 0x2545F491u;
  const auto uniform = [&x] {  // xorshift32, top 24 bits in [-1, 1)
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    return static_cast<float>(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
  };
  for (size_t i = 0; i < k.size(); ++i) k[i] = uniform(), v[i] = uniform();
  std::vector<uint8_t> mem(static_cast<size_t>(n_pages) * page);
  std::vector<uint8_t*> dst(static_cast<size_t>(P), mem.data());
  std::vector<int32_t> slot(static_cast<size_t>(P));
  for (int32_t j = 0; j < P; ++j) slot[static_cast<size_t>(j)] = j;
  cpu::kv_write(kv_, k.data(), v.data(), P, dst.data(), slot.data());
  std::vector<Span> spans;
  for (int32_t i = 0; i < n_pages; ++i) {
    if (i > 0) std::memcpy(mem.data() + static_cast<size_t>(i) * page, mem.data(), page);
    spans.push_back({mem.data() + static_cast<size_t>(i) * page, i * P, P});
  }
  std::vector<float> q(static_cast<size_t>(n_head_) * static_cast<size_t>(kv_.head_dim));
  for (float& f : q) f = uniform();
  const size_t row = static_cast<size_t>(n_head_) * cpu::part_stride(kv_.head_dim);
  std::vector<float> out(row);
  SplitJob job;  // no fences to wait for, no flag to raise
  job.q = q.data();
  job.out = out.data();
  job.entries.push_back({n_pages * P, std::move(spans)});
  run(job);  // untimed: the pages' first touch, the pool's threads waking
  constexpr int kPasses = 3;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kPasses; ++i) run(job);
  const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  {
    std::lock_guard<std::mutex> lock(mu_);
    busy_s_ = 0;
    bytes_ = 0;
  }
  check();
  return t > 0 ? static_cast<double>(kPasses) * static_cast<double>(mem.size()) / t : 0.0;
}

void SplitWorker::check() {
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::swap(e, error_);
  }
  if (e) std::rethrow_exception(e);
}

void SplitWorker::loop() {
  for (;;) {
    SplitJob job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    run(job);
  }
}

// One region of the pool a job: thread 0 waits for the fences while the others spin, so that
// none has to be woken when the queries land; then all take the entries' tasks in turn, and
// whichever finishes an entry's last merge raises its flag (in entry order).
void SplitWorker::run(const SplitJob& job) {
  const size_t n = job.entries.size();
  if (n == 0) return;
  const size_t row = static_cast<size_t>(n_head_) * cpu::part_stride(kv_.head_dim);
  size_t part_floats = 0;
  for (const SplitEntry& e : job.entries) part_floats += e.spans.size() * row;
  rows_.resize(std::max(rows_.size(), part_floats));
  while (tasks_.size() < n) tasks_.emplace_back();
  std::atomic<int> state{0};  // 0: waiting for the fences, 1: go, 2: failed
  std::atomic<size_t> raised{0};
  std::exception_ptr error;
  auto mark = std::chrono::steady_clock::now();
  const auto finish = [&](size_t k) {  // entry k is complete: count it, raise its flag
    for (int i = 0; raised.load(std::memory_order_acquire) < k; ++i)
      i < 4096 ? _mm_pause() : std::this_thread::yield();
    const auto now = std::chrono::steady_clock::now();
    size_t bytes = 0;
    for (const Span& s : job.entries[k].spans)
      bytes += static_cast<size_t>(s.n) * (kv_.k_row + kv_.v_row);
    {  // counted before the flag: the step that waits for it then sees them
      std::lock_guard<std::mutex> lock(mu_);
      busy_s_ += std::chrono::duration<double>(now - mark).count();
      bytes_ += bytes;
    }
    mark = now;
    if (job.flag >= 0) dev_.raise(job.flag, job.ticket + k);
    raised.store(k + 1, std::memory_order_release);
  };
  pool_.run([&](int tid, int) {
    if (tid == 0) {
      try {
        if (job.stored >= 0) dev_.wait_host(job.stored);
        if (job.q_ready >= 0) dev_.wait_host(job.q_ready);
        mark = std::chrono::steady_clock::now();
        float* part = rows_.data();
        for (size_t k = 0; k < n; ++k) {
          const SplitEntry& e = job.entries[k];
          AttentionArgs a;
          a.q = job.q + k * static_cast<size_t>(n_head_) * static_cast<size_t>(kv_.head_dim);
          a.pos = &e.pos;
          a.n_tok = 1;
          a.spans = e.spans.data();
          a.n_spans = static_cast<int32_t>(e.spans.size());
          a.kv = kv_;
          a.n_head = n_head_;
          a.scale = scale_;
          tasks_[k].prepare(a, pool_.size(), part, job.out + k * row);
          part += e.spans.size() * row;
        }
        state.store(1, std::memory_order_release);
      } catch (...) {
        error = std::current_exception();
        state.store(2, std::memory_order_release);
      }
    }
    for (int i = 0; state.load(std::memory_order_acquire) == 0; ++i)
      i < 65536 ? _mm_pause() : std::this_thread::yield();
    if (state.load(std::memory_order_acquire) != 1) return;
    for (size_t k = 0; k < n; ++k)
      if (tasks_[k].work()) finish(k);
  });
  if (error) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = error;
    }
    if (job.flag >= 0) dev_.raise(job.flag, job.ticket + n - 1);  // the device never waits forever
  }
}

int32_t default_split_threads() {
  return std::max(1, default_thread_count() - 1);
}

}  // namespace kvs
