#include "kvs/backend/device.h"

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

}  // namespace kvs
