// --h2d-limit: a fast link made to behave like a slower one (a PCIe 5 x8 card on a PCIe 5 x16
// host). Each host-to-device copy holds its stream until its bytes would have arrived at the
// limit: a copy of n bytes that starts at t ends no earlier than t + n / limit. Copies on a
// stream run one at a time, so they move at most the limit's bytes in any stretch of time, and
// the stream's busy time (what the planner measures the link by) is what the slower link's
// would be, whether the copies come back to back or one at a time.
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <mutex>
#include <thread>

namespace kvs {

class Pacer {
 public:
  explicit Pacer(double bytes_per_s) : rate_(bytes_per_s) {}

  // On the stream's thread: a copy starts; after it, hold() until its n bytes have arrived.
  void start() { start_ = std::chrono::steady_clock::now(); }
  void hold(size_t n) const {
    std::this_thread::sleep_until(
        start_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                     std::chrono::duration<double>(static_cast<double>(n) / rate_)));
  }

  // Where the stream's thread learns a copy's size only from the issuing thread (CUDA's host
  // functions take one pointer): issue() queues it in stream order, hold_next() takes it.
  void issue(size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    sizes_.push_back(n);
  }
  void hold_next() {
    size_t n;
    {
      std::lock_guard<std::mutex> lock(mu_);
      n = sizes_.front();
      sizes_.pop_front();
    }
    hold(n);
  }

 private:
  double rate_;
  std::chrono::steady_clock::time_point start_{};
  std::mutex mu_;
  std::deque<size_t> sizes_;
};

}  // namespace kvs
