#include "kvs/backend/cpu/copy_engine.h"

#include <chrono>
#include <cstring>

namespace kvs::cpu {

CopyEngine::CopyEngine() : thread_([this] { loop(); }) {}

CopyEngine::~CopyEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CopyEngine::push(const Op& op) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(op);
  }
  cv_.notify_one();
}

void CopyEngine::copy(void* dst, const void* src, size_t n) {
  push({Op::Copy, dst, src, n, nullptr, 0});
}
void CopyEngine::signal(Fence* f, uint64_t seq) {
  push({Op::Signal, nullptr, nullptr, 0, f, seq});
}
void CopyEngine::wait(const Fence* f, uint64_t seq) {
  push({Op::Wait, nullptr, nullptr, 0, const_cast<Fence*>(f), seq});
}

void CopyEngine::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

double CopyEngine::busy_seconds() const {
  return static_cast<double>(busy_ns_.load(std::memory_order_relaxed)) * 1e-9;
}

void CopyEngine::limit(double bytes_per_s) {
  std::lock_guard<std::mutex> lock(mu_);
  pacer_ = std::make_unique<Pacer>(bytes_per_s);
}

void CopyEngine::loop() {
  for (;;) {
    Op op;
    Pacer* pacer;
    {
      std::unique_lock<std::mutex> lock(mu_);
      busy_ = false;
      if (queue_.empty()) idle_cv_.notify_all();
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop requested and nothing left
      op = queue_.front();
      queue_.pop_front();
      busy_ = true;
      pacer = pacer_.get();
    }
    switch (op.kind) {
      case Op::Copy: {
        auto t0 = std::chrono::steady_clock::now();
        if (pacer) pacer->start();
        std::memcpy(op.dst, op.src, op.n);
        if (pacer) pacer->hold(op.n);
        busy_ns_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now() - t0)
                               .count(),
                           std::memory_order_relaxed);
        break;
      }
      case Op::Signal:
        op.fence->open(op.seq);
        break;
      case Op::Wait:
        op.fence->block_until(op.seq);
        break;
    }
  }
}

}  // namespace kvs::cpu
