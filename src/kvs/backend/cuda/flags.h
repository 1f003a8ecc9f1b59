// The CUDA device's flags (Device::make_flag): counters in pinned host memory, mapped into the
// device's address space, that host threads raise and a one-thread kernel polls to hold a
// stream (split attention: the compute stream waits there for the CPU's partials of a layer).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kvs/backend/device.h"

namespace kvs::cuda {

class Flags {
 public:
  Flags() = default;
  ~Flags();
  Flags(const Flags&) = delete;
  Flags& operator=(const Flags&) = delete;

  FlagId make();
  void raise(FlagId f, uint64_t value);                 // any host thread
  void wait(cudaStream_t s, FlagId f, uint64_t value);  // later work on s waits for it

 private:
  uint64_t& at(FlagId f) const;
  static constexpr int kMax = 64;
  uint64_t* host_ = nullptr;    // kMax counters, pinned
  uint64_t* device_ = nullptr;  // the same memory, as the device addresses it
  int n_ = 0;
};

}  // namespace kvs::cuda
