// The operations of a decode step as the CUDA device records them, to launch again as a unit.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "kvs/backend/cuda/common.cuh"
#include "kvs/backend/cuda/kernels.h"

namespace kvs::cuda {

// A recorded step's operations: each a trivially copyable closure kept by value in one buffer
// and called through a function pointer, so recording a step allocates nothing once the
// buffers have grown (a std::function would cost an allocation and a free per operation).
class Calls {
 public:
  template <class F>
  void add(const F& f) {
    static_assert(std::is_trivially_copyable_v<F> && std::is_trivially_destructible_v<F> &&
                  alignof(F) <= kAlign);
    const size_t off = (bytes_.size() + kAlign - 1) / kAlign * kAlign;
    bytes_.resize(off + sizeof(F));
    std::memcpy(bytes_.data() + off, &f, sizeof(F));
    ops_.push_back({off, [](const std::byte* p) { (*reinterpret_cast<const F*>(p))(); }});
  }
  void run() const {
    for (const Op& o : ops_) o.call(bytes_.data() + o.off);
  }
  void clear() { bytes_.clear(), ops_.clear(); }

 private:
  static constexpr size_t kAlign = 16;  // what operator new gives the buffer
  struct Op {
    size_t off;
    void (*call)(const std::byte*);
  };
  std::vector<std::byte> bytes_;
  std::vector<Op> ops_;
};

}  // namespace kvs::cuda
