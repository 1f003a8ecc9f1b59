// The CPU backend: a simulated device whose memory is a separately accounted region with an
// enforced capacity; kernels in kernels.cpp.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <deque>

#include "kvs/backend/cpu/copy_engine.h"
#include "kvs/backend/cpu/host_attention.h"
#include "kvs/backend/cpu/kernels.h"
#include "kvs/backend/cpu/quant_dot.h"
#include "kvs/backend/device.h"
#include "kvs/util/error.h"
#include "kvs/util/parse.h"
#include "kvs/util/threadpool.h"

namespace kvs {
namespace {

class CpuDevice final : public Device {
 public:
  // Token by token through the delta rule: a state then has the same bits whatever steps its
  // positions came in, so a prompt cache's checkpoints resume exactly; the rule is a small part
  // of a token's work here. Every step is batch-invariant, and the span partials are the host
  // attention's own.
  explicit CpuDevice(size_t capacity)
      : Device({.gated_delta_net = true, .delta_net_chunk = 1, .cpu_partials = true}),
        capacity_(capacity) {}

  std::string name() const override { return "cpu"; }

  DeviceBuffer alloc(size_t bytes, const char* what) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (capacity_ != 0 && used_ + bytes > capacity_)
      fail("device memory: cannot allocate ", format_bytes(bytes), " for ", what, " (",
           format_bytes(used_), " of ", format_bytes(capacity_), " in use)");
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    KVS_CHECK(p != nullptr, "out of host memory allocating ", format_bytes(bytes), " for ", what);
    used_ += bytes;
    sizes_[p] = bytes;
    return DeviceBuffer(this, p, bytes);
  }
  DeviceBuffer alloc_host(size_t bytes, const char* what) override {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    KVS_CHECK(p != nullptr, "out of host memory allocating ", format_bytes(bytes), " for ", what);
    std::lock_guard<std::mutex> lock(mu_);
    host_.insert(p);
    return DeviceBuffer(this, p, bytes);
  }
  void free(void* p) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (host_.erase(p)) {
      std::free(p);
      return;
    }
    auto it = sizes_.find(p);
    if (it == sizes_.end()) return;
    used_ -= it->second;
    sizes_.erase(it);
    std::free(p);
  }
  size_t capacity() const override { return capacity_; }
  size_t used() const override { return used_; }
  void upload(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void download(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  // The weights count against the capacity at their file's size, as they would on a GPU, so
  // --vram-limit and the plan mean the same on both backends. The CPU reads most in place; the
  // 32-element formats' matrices are repacked into the CPU layout (quant_dot.h), as large but
  // for rows that end in a short group.
  Weights place_weights(const Weights& host) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      const size_t bytes = host.matrix_bytes() +
                           (host.tok_embd.data != host.output.data ? host.tok_embd.bytes() : 0);
      if (capacity_ != 0 && used_ + bytes > capacity_)
        fail("device memory: the weights need ", format_bytes(bytes), " but only ",
             format_bytes(capacity_ - used_), " of ", format_bytes(capacity_), " are free");
      used_ += bytes;
    }
    Weights out = host;
    const std::vector<Matrix*> mats = placed_matrices(out);
    size_t packed = 0;
    for (const Matrix* m : mats)
      if (cpu::cpu_repacked(m->type))
        packed +=
            (cpu::cpu_row_bytes(m->type, m->n_in) * static_cast<size_t>(m->n_out) + 63) / 64 * 64;
    if (packed == 0) return out;
    uint8_t* at = static_cast<uint8_t*>(std::aligned_alloc(64, packed));
    KVS_CHECK(at != nullptr, "out of host memory repacking ", format_bytes(packed), " of weights");
    placed_.emplace_back(at);
    for (Matrix* m : mats) {
      if (!cpu::cpu_repacked(m->type)) continue;
      const Matrix file = *m;
      m->row_bytes = cpu::cpu_row_bytes(m->type, m->n_in);
      m->data = at;
      thread_pool().parallel_for(m->n_out, 256, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r)
          cpu::pack_row(m->type, file.row(r), at + static_cast<size_t>(r) * m->row_bytes, m->n_in);
      });
      at += (m->bytes() + 63) / 64 * 64;
    }
    if (host.output.data == host.tok_embd.data) out.output = out.tok_embd;  // tied: packed once
    return out;
  }

  void embed(const Matrix& emb, const int32_t* ids, int32_t n, float* x) override {
    cpu::embed(emb, ids, n, x);
  }
  void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t n,
               float eps) override {
    cpu::rmsnorm(x, w, y, rows, n, eps);
  }
  void matmuls(const float* x, int64_t n_tok, const MatJob* jobs, int n_jobs) override {
    // The jobs share x: it is quantized once for all that take int8 activations.
    bool any_int = false;
    for (int i = 0; i < n_jobs; ++i) any_int = any_int || cpu::has_int_dot(jobs[i].w->type);
    if (any_int) {
      const size_t n = static_cast<size_t>(n_tok * cpu::x_groups(jobs[0].w->n_in));
      if (xq_.size() < n) xq_.resize(n);
      cpu::quantize_x(x, n_tok, jobs[0].w->n_in, xq_.data());
    }
    cpu::matmuls(x, any_int ? xq_.data() : nullptr, n_tok, jobs, n_jobs);
  }
  void rope(float* q, float* k, const int32_t* pos, int32_t n_tok, int32_t n_head,
            int32_t n_head_kv, const RopeParams& p) override {
    cpu::rope(q, pos, n_tok, n_head, p);
    if (k) cpu::rope(k, pos, n_tok, n_head_kv, p);
  }
  void swiglu(float* gate, const float* up, int64_t n) override { cpu::swiglu(gate, up, n); }
  void geglu(float* gate, const float* up, int64_t n) override { cpu::geglu(gate, up, n); }
  void gated_delta_net(const DeltaNetArgs& a) override { cpu::gated_delta_net(a); }
  void sigmoid_mul(float* x, const float* gate, int64_t n) override {
    cpu::sigmoid_mul(x, gate, n);
  }
  void scale(float* x, float s, int64_t n) override { cpu::scale(x, s, n); }
  void add(float* x, const float* y, int64_t n) override { cpu::add(x, y, n); }
  void kv_write(const KvLayout& l, const float* k, const float* v, int32_t n_tok,
                uint8_t* const* pages, const int32_t* slots) override {
    cpu::kv_write(l, k, v, n_tok, pages, slots);
  }
  void attention(const AttentionArgs& a) override { cpu::attention(a); }

  // The compute stream is the calling thread: its work is done when the call returns.
  void copy(Stream s, void* dst, const void* src, size_t n) override {
    if (s == Stream::Compute)
      std::memcpy(dst, src, n);
    else
      engine(s).copy(dst, src, n);
  }
  // Fences are made while setting up, before the streams use them.
  FenceId make_fence() override {
    fences_.emplace_back();
    return static_cast<FenceId>(fences_.size() - 1);
  }
  void record(Stream s, FenceId id) override {
    cpu::Fence& f = fence(id);
    const uint64_t seq = f.recorded.fetch_add(1, std::memory_order_acq_rel) + 1;
    if (s == Stream::Compute)
      f.open(seq);
    else
      engine(s).signal(&f, seq);
  }
  void wait(Stream s, FenceId id) override {
    cpu::Fence& f = fence(id);
    const uint64_t seq = f.recorded.load(std::memory_order_acquire);
    if (s == Stream::Compute) {
      const auto t0 = std::chrono::steady_clock::now();
      f.block_until(seq);
      wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } else
      engine(s).wait(&f, seq);
  }
  void wait_host(FenceId id) override {
    cpu::Fence& f = fence(id);
    f.block_until(f.recorded.load(std::memory_order_acquire));
  }
  bool done(FenceId id) override {
    cpu::Fence& f = fence(id);
    return f.reached.load(std::memory_order_acquire) >= f.recorded.load(std::memory_order_acquire);
  }
  double wait_seconds() override { return wait_s_; }
  double busy_seconds(Stream s) override {
    return s == Stream::Compute ? 0.0 : engine(s).busy_seconds();
  }
  void limit_copy_in(double bytes_per_s) override { copy_in_.limit(bytes_per_s); }
  void sync() override {
    copy_in_.drain();
    copy_out_.drain();
  }

  // A flag is a fence that host threads open: its `reached` is the counter.
  FlagId make_flag() override {
    flags_.emplace_back();
    return static_cast<FlagId>(flags_.size() - 1);
  }
  void raise(FlagId id, uint64_t value) override { flag(id).open(value); }
  void wait_flag(Stream s, FlagId id, uint64_t value) override {
    cpu::Fence& f = flag(id);
    if (s == Stream::Compute) {
      const auto t0 = std::chrono::steady_clock::now();
      f.block_until(value);
      flag_wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } else {
      engine(s).wait(&f, value);
    }
  }
  double flag_wait_seconds() override { return flag_wait_s_; }
  void fold(const AttentionArgs& a, const float* parts) override { cpu::fold_partials(a, parts); }

 private:
  double wait_s_ = 0;       // the compute thread blocked on fences
  double flag_wait_s_ = 0;  // and on flags
  cpu::CopyEngine& engine(Stream s) { return s == Stream::CopyIn ? copy_in_ : copy_out_; }
  cpu::Fence& fence(FenceId id) {
    KVS_CHECK(id >= 0 && static_cast<size_t>(id) < fences_.size(), "unknown fence ", id);
    return fences_[static_cast<size_t>(id)];
  }
  cpu::Fence& flag(FlagId id) {
    KVS_CHECK(id >= 0 && static_cast<size_t>(id) < flags_.size(), "unknown flag ", id);
    return flags_[static_cast<size_t>(id)];
  }

  size_t capacity_;
  size_t used_ = 0;
  std::mutex mu_;
  std::unordered_map<void*, size_t> sizes_;
  std::unordered_set<void*> host_;
  std::deque<cpu::Fence> fences_, flags_;
  cpu::CopyEngine copy_in_, copy_out_;
  std::vector<cpu::XGroup> xq_;  // the jobs' input quantized: [n_tok][x_groups(n_in)]
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::vector<std::unique_ptr<uint8_t, Free>> placed_;  // every placed model's repacked matrices
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(size_t capacity) {
  return std::make_unique<CpuDevice>(capacity);
}

}  // namespace kvs
