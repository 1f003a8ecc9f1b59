// A small fork-join pool for the CPU kernels: the calling thread takes part, workers spin
// briefly before sleeping so the many short parallel regions of a decode step stay cheap.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvs {

class ThreadPool {
 public:
  // n_threads in all, the caller included; where cpus is given, worker t (1 .. n_threads - 1)
  // runs on cpus[t] alone (the caller's thread is its own to pin: pin_this_thread).
  explicit ThreadPool(int n_threads, std::vector<int> cpus = {});
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // fn(tid, n_threads) on every thread; returns when all are done. Called from inside a
  // parallel region it runs fn(0, 1) inline.
  void run(const std::function<void(int, int)>& fn);

  // fn(begin, end) over [0, n) in chunks of about `grain` items, handed out dynamically.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker(int tid);
  void run_impl(const std::function<void(int, int)>& fn, bool optional);

  int n_threads_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  int claims_ = 0;  // workers that may still join the current job (guarded by mu_)
  bool stop_ = false;
};

// The process-wide pool used by the CPU backend. Sized by set_thread_count (the -t flag) or,
// by default, the KVS_THREADS environment variable or the number of hardware threads; never
// more than the hardware's threads (spinning workers beyond them starve each other).
ThreadPool& thread_pool();
void set_thread_count(int n);
int default_thread_count();
int hardware_threads();

// memcpy(dst, src, n) of each, spread over thread_pool(): gigabytes of pages (a resumed
// conversation's history) or fresh memory's first touches take one thread a large part of a
// second.
struct PoolCopy {
  void* dst;
  const void* src;
  size_t n;
};
void copy_on_pool(const std::vector<PoolCopy>& copies);

// The CPUs this process may run on (its affinity mask), in increasing order.
std::vector<int> allowed_cpus();
// Keeps the calling thread on `cpu`; false where the system refuses.
bool pin_this_thread(int cpu);

}  // namespace kvs
