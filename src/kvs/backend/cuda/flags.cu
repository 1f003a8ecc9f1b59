#include <atomic>

#include "kvs/backend/cuda/common.cuh"
#include "kvs/backend/cuda/flags.h"

namespace kvs::cuda {
namespace {

// Returns once the host has raised the counter to `value`: a read over the bus a microsecond
// or so (of system scope, acquiring: what the host wrote before the count is seen after it),
// while the rest of the GPU goes on with the other streams.
__device__ __forceinline__ unsigned long long load_acquire(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__global__ void wait_flag(const unsigned long long* flag, unsigned long long value) {
  while (load_acquire(flag) < value) __nanosleep(1000);
}

}  // namespace

Flags::~Flags() {
  if (host_) cudaFreeHost(host_);
}

FlagId Flags::make() {
  if (!host_) {
    void* p = nullptr;
    KVS_CUDA_CHECK(cudaHostAlloc(&p, kMax * sizeof(uint64_t), cudaHostAllocMapped));
    host_ = static_cast<uint64_t*>(p);
    for (int i = 0; i < kMax; ++i) host_[i] = 0;
    void* d = nullptr;
    KVS_CUDA_CHECK(cudaHostGetDevicePointer(&d, p, 0));
    device_ = static_cast<uint64_t*>(d);
  }
  KVS_CHECK(n_ < kMax, "cuda: more than ", kMax, " flags");
  return n_++;
}

uint64_t& Flags::at(FlagId f) const {
  KVS_CHECK(f >= 0 && f < n_, "unknown flag ", f);
  return host_[f];
}

void Flags::raise(FlagId f, uint64_t value) {
  // Released: the partials written before it are in memory when the device sees the count.
  std::atomic_ref<uint64_t>(at(f)).store(value, std::memory_order_release);
}

void Flags::wait(cudaStream_t s, FlagId f, uint64_t value) {
  at(f);
  launch(wait_flag, dim3(1), dim3(1), 0, s, reinterpret_cast<const unsigned long long*>(device_ + f),
         static_cast<unsigned long long>(value));
}

}  // namespace kvs::cuda
