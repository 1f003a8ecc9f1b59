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

void Device::matmuls_then(const float* x, int64_t n_tok, const MatJob* jobs, int n_jobs,
                          const NextOp& next) {
  KVS_CHECK(n_jobs == (next.kind == NextOp::Norm ? 1 : 2), "matmuls_then: ", n_jobs,
            " products before a ", next.kind == NextOp::Norm ? "norm" : "swiglu");
  matmuls(x, n_tok, jobs, n_jobs);
  const int64_t n = jobs[0].w->n_out;
  if (next.kind == NextOp::Norm)
    rmsnorm(jobs[0].y, next.w, next.y, n_tok, n, next.eps);
  else
    swiglu(jobs[0].y, jobs[1].y, n_tok * n);
}

}  // namespace kvs
