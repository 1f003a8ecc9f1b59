// The CUDA device's instruments: the copy streams' busy time, the per-operation profile
// (CudaOptions::profile) and the timing build's trace ring (CudaOptions::trace).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvs/backend/cuda/common.cuh"
#include "kvs/backend/cuda/kernels.h"

namespace kvs::cuda {

// Timing events, reused: one pool each for the profile and the copy timings.
class EventPool {
 public:
  EventPool() = default;
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  ~EventPool() {
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }
  cudaEvent_t take() {
    if (free_.empty()) {
      cudaEvent_t e;
      KVS_CUDA_CHECK(cudaEventCreate(&e));
      return e;
    }
    const cudaEvent_t e = free_.back();
    free_.pop_back();
    return e;
  }
  void give(cudaEvent_t e) { free_.push_back(e); }

 private:
  std::vector<cudaEvent_t> free_;
};

// The time of a copy stream's copies (or the compute stream's waits), from a pair of events
// recorded around each.
struct CopyTimes {
  std::deque<std::pair<cudaEvent_t, cudaEvent_t>> open;  // recorded, not yet read
  double seconds = 0;
  // The summed time of the finished pairs; their events go back to `pool`.
  double finished(EventPool& pool) {
    while (!open.empty()) {
      const auto [a, b] = open.front();
      const cudaError_t e = cudaEventQuery(b);
      if (e == cudaErrorNotReady) break;
      KVS_CUDA_CHECK(e);
      float ms = 0.0f;
      KVS_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
      seconds += ms / 1000.0;
      pool.give(a);
      pool.give(b);
      open.pop_front();
    }
    return seconds;
  }
};

// CudaOptions::profile: the GPU time of every Device operation, from events recorded around it on
// the compute stream, and the share of the time between the first and the last operation of
// each synchronised stretch that the GPU spent idle (launch gaps); printed when the device
// closes.
class Profile {
 public:
  explicit Profile(bool on) : on_(on) {}
  bool on() const { return on_; }
  void begin(cudaStream_t s, const char* name) {
    open_.push_back({name, events_.take(), events_.take()});
    KVS_CUDA_CHECK(cudaEventRecord(open_.back().a, s));
  }
  void end(cudaStream_t s) { KVS_CUDA_CHECK(cudaEventRecord(open_.back().b, s)); }
  // Reads the finished events (after a synchronisation).
  void collect() {
    if (open_.empty()) return;
    float ms = 0.0f;
    for (const Op& o : open_) {
      KVS_CUDA_CHECK(cudaEventElapsedTime(&ms, o.a, o.b));
      Total& t = totals_[o.name];
      ++t.calls;
      t.ms += ms;
      busy_ms_ += ms;
    }
    KVS_CUDA_CHECK(cudaEventElapsedTime(&ms, open_.front().a, open_.back().b));
    span_ms_ += ms;
    for (const Op& o : open_) events_.give(o.a), events_.give(o.b);
    open_.clear();
  }
  void report() const {
    if (!on_ || totals_.empty()) return;
    std::fprintf(stderr, "profile: GPU busy %.2f ms of %.2f ms between operations (%.1f %% idle)\n",
                 busy_ms_, span_ms_, span_ms_ > 0 ? 100.0 * (1.0 - busy_ms_ / span_ms_) : 0.0);
    std::vector<std::pair<std::string, Total>> v(totals_.begin(), totals_.end());
    std::sort(v.begin(), v.end(),
              [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    for (const auto& [name, t] : v)
      std::fprintf(stderr, "profile: %-18s %8lld calls %10.2f ms %9.2f us/call %5.1f %%\n",
                   name.c_str(), static_cast<long long>(t.calls), t.ms, 1000.0 * t.ms / t.calls,
                   100.0 * t.ms / busy_ms_);
  }

 private:
  struct Op {
    const char* name;
    cudaEvent_t a, b;
  };
  struct Total {
    int64_t calls = 0;
    double ms = 0;
  };
  bool on_;
  std::vector<Op> open_;
  EventPool events_;
  std::map<std::string, Total> totals_;
  double busy_ms_ = 0, span_ms_ = 0;
};

// Times one operation when profiling.
class Timed {
 public:
  Timed(Profile& p, cudaStream_t s, const char* name) : p_(p.on() ? &p : nullptr), s_(s) {
    if (p_) p_->begin(s, name);
  }
  ~Timed() {
    if (p_) p_->end(s_);
  }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  Profile* p_;
  cudaStream_t s_;
};

#ifdef KVS_TRACE
// The ring of a timing build (common.cuh): bound to the kernels when CudaOptions::trace names a
// file, written there at the end as "KVSTRACE", the count of records ever written and the ring's
// size (u64 each), then the ring.
class TraceRing {
 public:
  explicit TraceRing(const std::string& path) : path_(path) {
    if (path_.empty()) return;
    t_.cap = size_t{1} << 21;  // the last 2M blocks: about 18 one-token steps of an 8B model
    KVS_CUDA_CHECK(cudaMalloc(&t_.rec, t_.cap * sizeof(TraceRec)));
    KVS_CUDA_CHECK(cudaMalloc(&t_.count, sizeof(unsigned long long)));
    KVS_CUDA_CHECK(cudaMemset(t_.count, 0, sizeof(unsigned long long)));
    for (auto bind : {trace_bind_attention_decode, trace_bind_attention_decode_tc,
                      trace_bind_attention_prefill, trace_bind_matmul,
                      trace_bind_ops, trace_bind_delta_net})
      bind(t_);
  }
  TraceRing(const TraceRing&) = delete;
  TraceRing& operator=(const TraceRing&) = delete;
  ~TraceRing() {
    if (!t_.rec) return;
    write();
    cudaFree(t_.rec);
    cudaFree(t_.count);
  }

 private:
  void write() const {
    unsigned long long n = 0;
    std::vector<TraceRec> rec(t_.cap);
    if (cudaDeviceSynchronize() != cudaSuccess ||
        cudaMemcpy(&n, t_.count, sizeof n, cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(rec.data(), t_.rec, rec.size() * sizeof rec[0], cudaMemcpyDeviceToHost) !=
            cudaSuccess) {
      std::fprintf(stderr, "KVS_TRACE: reading the trace failed\n");
      return;
    }
    std::FILE* f = std::fopen(path_.c_str(), "wb");
    if (!f) {
      std::fprintf(stderr, "KVS_TRACE: cannot write %s\n", path_.c_str());
      return;
    }
    const unsigned long long head[2] = {n, t_.cap};
    const bool ok = std::fwrite("KVSTRACE", 1, 8, f) == 8 && std::fwrite(head, 8, 2, f) == 2 &&
                    std::fwrite(rec.data(), sizeof rec[0], rec.size(), f) == rec.size();
    if (std::fclose(f) != 0 || !ok)
      std::fprintf(stderr, "KVS_TRACE: writing %s failed\n", path_.c_str());
  }
  Trace t_;
  std::string path_;
};
#endif

}  // namespace kvs::cuda
