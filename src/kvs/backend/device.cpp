#include "kvs/backend/device.h"

#include "kvs/util/error.h"

namespace kvs {

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    dev_ = o.dev_;
    p_ = o.p_;
    n_ = o.n_;
    o.p_ = nullptr;
  }
  return *this;
}

void DeviceBuffer::reset() {
  if (p_ && dev_) dev_->free(p_);
  p_ = nullptr;
}

DeviceBuffer Device::alloc_managed(size_t, const char* what) {
  fail("--kv-mode unified needs the cuda backend (", name(), " has no managed memory for ", what,
       ")");
}

void Device::limit_copy_in(double) {
  fail("--h2d-limit is not available on the ", name(), " backend");
}

FlagId Device::make_flag() {
  fail("--kv-mode split is not available on the ", name(), " backend");
}
void Device::raise(FlagId, uint64_t) {
  fail("--kv-mode split is not available on the ", name(), " backend");
}
void Device::wait_flag(Stream, FlagId, uint64_t) {
  fail("--kv-mode split is not available on the ", name(), " backend");
}

void Device::fold(const AttentionArgs&, const float*) {
  fail("--kv-mode split is not available on the ", name(), " backend");
}

void Device::gated_delta_net(const DeltaNetArgs&) {
  fail("Gated DeltaNet layers (qwen35) are not implemented on the ", name(), " backend");
}

void Device::sigmoid_mul(float*, const float*, int64_t) {
  fail("the gated attention of qwen35 (sigmoid_mul) is not implemented on the ", name(),
       " backend");
}

}  // namespace kvs
