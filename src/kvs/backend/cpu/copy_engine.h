// The CPU backend's asynchronous machinery: a copy engine thread per copy stream and fences
// that are real synchronisation objects, so the streaming pipeline runs with true concurrency
// (and its races) without a GPU. The compute stream is the calling thread itself.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kvs/backend/pacer.h"

namespace kvs::cpu {

// Fence state: `recorded` counts records issued by the host, `reached` the last one a stream
// passed. A wait captures the record count when it is issued.
struct Fence {
  std::atomic<uint64_t> recorded{0};
  std::atomic<uint64_t> reached{0};
  void open(uint64_t seq) {
    reached.store(seq, std::memory_order_release);
    reached.notify_all();
  }
  void block_until(uint64_t seq) const {
    for (uint64_t r = reached.load(std::memory_order_acquire); r < seq;
         r = reached.load(std::memory_order_acquire))
      reached.wait(r, std::memory_order_acquire);
  }
};

class CopyEngine {
 public:
  CopyEngine();
  ~CopyEngine();
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  void copy(void* dst, const void* src, size_t n);
  void signal(Fence* f, uint64_t seq);      // opens f at seq when the queue reaches it
  void wait(const Fence* f, uint64_t seq);  // the queue stalls until f reaches seq
  void drain();                             // the caller waits until the queue is empty
  double busy_seconds() const;              // time spent copying (for the busy fraction)
  // Later copies move at most this many bytes a second (--h2d-limit, backend/pacer.h); their
  // holds count as busy time.
  void limit(double bytes_per_s);

 private:
  struct Op {
    enum Kind { Copy, Signal, Wait } kind;
    void* dst;
    const void* src;
    size_t n;
    Fence* fence;
    uint64_t seq;
  };
  void push(const Op& op);
  void loop();

  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<Op> queue_;
  bool busy_ = false, stop_ = false;
  std::atomic<int64_t> busy_ns_{0};
  std::unique_ptr<Pacer> pacer_;  // guarded by mu_
  std::thread thread_;
};

}  // namespace kvs::cpu
