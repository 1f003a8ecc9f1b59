// The CUDA backend's Device: cudaMalloc memory bounded by a capacity (the GPU's free memory or
// --vram-limit), pinned host memory, one compute and two copy streams, events as fences. The
// small host arrays the engine passes to kernels (token ids, positions, spans, page pointers)
// go through a pinned staging ring onto the compute stream.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kvs/backend/cuda/backend.h"
#include "kvs/backend/cuda/common.cuh"
#include "kvs/backend/cuda/kernels.h"
#include "kvs/backend/cuda/profile.h"
#include "kvs/backend/cuda/scratch.h"
#include "kvs/backend/cuda/flags.h"
#include "kvs/backend/cuda/step_calls.h"
#include "kvs/backend/cuda/weights.h"
#include "kvs/backend/device.h"
#include "kvs/backend/pacer.h"
#include "kvs/util/parse.h"

namespace kvs {
namespace cuda {

DeviceBuffer& Ctx::grow(DeviceBuffer& b, size_t bytes, const char* what, bool zero) {
  if (b.size() < bytes) {
    if (pause) pause();
    KVS_CUDA_CHECK(cudaStreamSynchronize(stream));  // the old buffer may still be read
    if (side) KVS_CUDA_CHECK(cudaStreamSynchronize(side));
    b.reset();
    b = dev->alloc(grown(bytes), what);
    if (zero) {
      KVS_CUDA_CHECK(cudaMemsetAsync(b.as(), 0, b.size(), stream));
      KVS_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    if (resume) resume();
  }
  return b;
}

}  // namespace cuda

namespace {

using cuda::Calls;
using cuda::Ctx;
using cuda::EventPool;
using cuda::Profile;
using cuda::Timed;

class CudaDevice final : public Device {
 public:
  CudaDevice(size_t limit, const CudaOptions& opt)
      : Device({.gated_delta_net = true, .invariant_tokens = kCudaInvariantTokens}),
        prof_(opt.profile),
#ifdef KVS_TRACE
        trace_(opt.trace),
#endif
        graphs_(opt.graphs && !opt.profile),
        l2_next_bytes_(static_cast<size_t>(opt.l2_next_mib) << 20) {
    int n = 0;
    KVS_CHECK(cudaGetDeviceCount(&n) == cudaSuccess && n > 0,
              "--backend cuda: no CUDA device is visible");
    KVS_CUDA_CHECK(cudaSetDevice(0));
    cudaDeviceProp prop{};
    KVS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    name_ = cat("cuda: ", prop.name, " (sm_", prop.major, prop.minor, ", ",
                format_bytes(prop.totalGlobalMem), ")");
    size_t free_b = 0, total = 0;
    KVS_CUDA_CHECK(cudaMemGetInfo(&free_b, &total));
    // Leave room for the CUDA context's own needs and cuBLAS.
    const size_t usable = free_b > (size_t{1} << 30) ? free_b - (size_t{1} << 29) : free_b / 2;
    KVS_CHECK(limit <= usable || limit == 0, "--vram-limit ", format_bytes(limit),
              " is more than the ", format_bytes(usable), " the GPU has free");
    capacity_ = limit ? limit : usable;
    limited_ = limit != 0;
    free0_ = free_b;
    cuda::pdl_enabled() = prop.major >= 9 && opt.pdl;
    for (cudaStream_t& s : streams_)
      KVS_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    ctx_.dev = this;
    ctx_.stream = streams_[0];
    ctx_.n_sm = prop.multiProcessorCount;
    ctx_.smem_optin = prop.sharedMemPerBlockOptin;
    ctx_.decode_split = opt.decode_split;
    KVS_CHECK(opt.l2_next_mib >= 0 && opt.l2_next_mib <= 64, "CUDA options: l2_next_mib ",
              opt.l2_next_mib, " (0-64)");
    KVS_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx_.side, cudaStreamNonBlocking));
    for (cudaEvent_t* e : {&ctx_.side_ready, &ctx_.converted[0], &ctx_.converted[1],
                           &ctx_.consumed[0], &ctx_.consumed[1]})
      KVS_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    KVS_CHECK(cublasCreate(&ctx_.cublas) == CUBLAS_STATUS_SUCCESS, "cuBLAS: cublasCreate failed");
    KVS_CHECK(cublasSetStream(ctx_.cublas, ctx_.stream) == CUBLAS_STATUS_SUCCESS,
              "cuBLAS: cublasSetStream failed");
    KVS_CUDA_CHECK(cudaHostAlloc(&stage_h_, kStage, cudaHostAllocDefault));
    KVS_CUDA_CHECK(cudaMalloc(&stage_d_, kStage));
  }
  ~CudaDevice() override {
    cudaDeviceSynchronize();
    prof_.collect();
    prof_.report();
    if (exec_) cudaGraphExecDestroy(exec_);
    if (balloon_) cudaFree(balloon_);
    for (cuda::CopyTimes& ct : copy_times_)
      for (auto [a, b] : ct.open) cudaEventDestroy(a), cudaEventDestroy(b);
    for (auto [a, b] : flag_times_.open) cudaEventDestroy(a), cudaEventDestroy(b);
    inv_freq_.clear();
    ctx_.w16.reset();
    ctx_.x16.reset();
    ctx_.part.reset();
    ctx_.xq.reset();
    placed_.buffers.clear();
    for (cudaEvent_t e : fences_) cudaEventDestroy(e);
    cublasDestroy(ctx_.cublas);
    cudaFreeHost(stage_h_);
    cudaFree(stage_d_);
    for (cudaStream_t s : streams_) cudaStreamDestroy(s);
    for (cudaEvent_t e : {ctx_.side_ready, ctx_.converted[0], ctx_.converted[1], ctx_.consumed[0],
                          ctx_.consumed[1]})
      cudaEventDestroy(e);
    cudaStreamDestroy(ctx_.side);
  }

  std::string name() const override { return name_; }

  DeviceBuffer alloc(size_t bytes, const char* what) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (used_ + bytes > capacity_)
      fail("device memory: cannot allocate ", format_bytes(bytes), " for ", what, " (",
           format_bytes(used_), " of ", format_bytes(capacity_), " in use)");
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));
    if (e != cudaSuccess)
      fail("CUDA: cudaMalloc of ", format_bytes(bytes), " for ", what,
           " failed: ", cudaGetErrorString(e));
    used_ += bytes;
    sizes_[p] = bytes;
    ++gen_;
    return DeviceBuffer(this, p, bytes);
  }
  DeviceBuffer alloc_host(size_t bytes, const char* what) override {
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocDefault);
    if (e != cudaSuccess)
      fail("CUDA: cudaHostAlloc of ", format_bytes(bytes), " for ", what,
           " failed: ", cudaGetErrorString(e));
    std::lock_guard<std::mutex> lock(mu_);
    host_.insert(p);
    return DeviceBuffer(this, p, bytes);
  }
  DeviceBuffer alloc_managed(size_t bytes, const char* what) override {
    void* p = nullptr;
    const cudaError_t e = cudaMallocManaged(&p, std::max<size_t>(bytes, 1), cudaMemAttachGlobal);
    if (e != cudaSuccess)
      fail("CUDA: cudaMallocManaged of ", format_bytes(bytes), " for ", what,
           " failed: ", cudaGetErrorString(e));
    std::lock_guard<std::mutex> lock(mu_);
    managed_[p] = bytes;
    ++gen_;
    return DeviceBuffer(this, p, bytes);
  }
  void set_balloon(bool on) override {
    if (!on && balloon_) {
      KVS_CUDA_CHECK(cudaDeviceSynchronize());
      KVS_CUDA_CHECK(cudaFree(balloon_));
      balloon_ = nullptr;
    }
    if (!on || !limited_ || balloon_) return;
    // The balloon takes what the GPU had free at start beyond the limit, evicting managed
    // pages that sit there (the driver keeps evicted frames cached, so the free figure of the
    // moment would leave them room). Memory outside the accounting (cuBLAS, staging) may make
    // that a little too much: it shrinks by 64 MiB steps until it fits.
    KVS_CUDA_CHECK(cudaDeviceSynchronize());
    size_t want = free0_ > capacity_ ? free0_ - capacity_ : 0;
    for (int i = 0; want > 0 && i < 32; ++i, want -= std::min(want, size_t{64} << 20)) {
      if (cudaMalloc(&balloon_, want) == cudaSuccess) break;
      balloon_ = nullptr;
      (void)cudaGetLastError();
    }
    if (!balloon_ && want > 0)
      fail("CUDA: no --vram-limit balloon fits (", format_bytes(free0_ - capacity_),
           " wanted); lower the limit or free the GPU");
    if (!said_)
      std::fprintf(stderr, "kvstream: --vram-limit: a balloon of %s holds the GPU beyond it\n",
                   format_bytes(want).c_str());
    said_ = true;
  }
  void free(void* p) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (host_.erase(p)) {
      cudaFreeHost(p);
      return;
    }
    if (managed_.erase(p)) {
      ++gen_;
      cudaFree(p);
      return;
    }
    auto it = sizes_.find(p);
    if (it == sizes_.end()) return;
    ++gen_;
    used_ -= it->second;
    sizes_.erase(it);
    cudaFree(p);
  }
  size_t capacity() const override { return capacity_; }
  size_t used() const override { return used_; }
  void upload(void* dst, const void* src, size_t n) override {
    quantized_ = {};
    KVS_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, streams_[0]));
    KVS_CUDA_CHECK(cudaStreamSynchronize(streams_[0]));
  }
  void download(void* dst, const void* src, size_t n) override {
    KVS_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, streams_[0]));
    KVS_CUDA_CHECK(cudaStreamSynchronize(streams_[0]));
  }

  void reserve(const Weights& w, int64_t n_tok, int64_t n_out_tok, int64_t max_spans,
               int32_t n_head, int32_t head_dim) override {
    const cuda::Reserved r = cuda::reserved_of(w, n_tok, n_out_tok, max_spans, n_head, head_dim);
    const cuda::PrefillScratch& p = r.scratch;
    if (p.w16) ctx_.scratch_w(p.w16 / sizeof(__half)), ctx_.scratch_x(p.x16 / sizeof(__half));
    if (p.kv16) ctx_.scratch_kv16(p.kv16), ctx_.scratch_spans16(p.spans16 / sizeof(Span));
    if (p.gdn) ctx_.scratch_gdn(p.gdn / sizeof(float));
    if (r.xq) ctx_.scratch_xq(r.xq);
    if (r.part) ctx_.scratch_part(r.part / sizeof(float));
  }

  size_t prefill_scratch(const Weights& w, int64_t n_tok, int64_t max_spans,
                         const KvLayout& kv) override {
    prefill_ = cuda::workspace_scratch_of(w, n_tok, max_spans, kv);
    return prefill_.bytes();
  }
  void lend_prefill_scratch(uint8_t* p) override {
    if (p && p == lent_at_ && prefill_ == lent_) return;
    KVS_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));  // the kernels may still use it
    KVS_CUDA_CHECK(cudaStreamSynchronize(ctx_.side));
    ctx_.lent_w16 = ctx_.lent_x16 = ctx_.lent_kv16 = ctx_.lent_spans16 = ctx_.lent_gdn = {};
    lent_at_ = p;
    lent_ = prefill_;
    if (!p) return;
    const std::pair<Ctx::Lent*, size_t> parts[] = {{&ctx_.lent_w16, prefill_.w16},
                                                   {&ctx_.lent_x16, prefill_.x16},
                                                   {&ctx_.lent_kv16, prefill_.kv16},
                                                   {&ctx_.lent_spans16, prefill_.spans16},
                                                   {&ctx_.lent_gdn, prefill_.gdn}};
    for (size_t off = 0; const auto& [lent, n] : parts) {
      *lent = {p + off, n};
      off += cuda::PrefillScratch::align(n);
    }
  }
  Weights place_weights(const Weights& host) override {
    return cuda::place_weights(*this, host, placed_);
  }

  // Every operation is launched through run(): at once, or kept for the end of a recorded
  // step, with key() describing it (see begin_step).
  void embed(const Matrix& emb, const int32_t* ids, int32_t n, float* x) override {
    for (int32_t t = 0; t < n; ++t)
      KVS_CHECK(ids[t] >= 0 && ids[t] < emb.n_out, "token id ", ids[t], " is out of range (vocab ",
                emb.n_out, ")");
    const int32_t* d_ids = stage(ids, n);
    const Matrix m = emb;
    key(1, m.data, m.type, m.n_in, m.n_out, m.row_bytes, d_ids, n, x);
    run("embed", [=, this] { cuda::embed(ctx_, m, d_ids, n, x); });
  }
  void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t n,
               float eps) override {
    const float* dw = dv(w);
    const bool q = quantizing(rows, n);
    key(2, x, dw, y, rows, n, eps, q);
    run("rmsnorm", [=, this] { cuda::rmsnorm(ctx_, x, dw, y, rows, n, eps, xq(q)); });
    if (q) quantized_ = {y, rows * n};
  }
  void matmuls(const float* x, int64_t n_tok, const MatJob* jobs, int n_jobs) override {
    KVS_CHECK(n_jobs >= 1 && n_jobs <= 8, "cuda: ", n_jobs, " matrices in one group");
    // The matrices themselves are kept, not the caller's pointers: a recorded step runs later,
    // and a caller may pass views it made for this call (qwen35's halves of wq).
    std::array<MatJob, 8> j;
    std::array<Matrix, 8> w;
    const bool q = quantized_.x == x && quantized_.n == n_tok * jobs[0].w->n_in;
    key(3, x, n_tok, n_jobs, q);
    for (int i = 0; i < n_jobs; ++i) {
      j[i] = jobs[i];
      w[i] = *jobs[i].w;
      if (j[i].bias) j[i].bias = dv(j[i].bias);
      const Matrix& m = w[i];
      key(m.data, m.type, m.n_in, m.n_out, m.row_bytes, j[i].y, j[i].bias, j[i].add);
    }
    const int at = next_product(j.data(), n_jobs, n_tok);
    run(n_tok <= cuda::kMaxSliceTok ? "matvec" : "gemm", [=, this] {
      std::array<MatJob, 8> jw = j;
      for (int i = 0; i < n_jobs; ++i) jw[i].w = &w[i];
      ctx_.next = at >= 0 ? next_[static_cast<size_t>(at)] : cuda::L2Next{};
      cuda::matmuls(ctx_, x, n_tok, jw.data(), n_jobs, xq(q));
    });
  }
  void rope(float* q, float* k, const int32_t* pos, int32_t n_tok, int32_t n_head,
            int32_t n_head_kv, const RopeParams& p) override {
    RopeParams r = p;
    if (r.freq_factors) r.freq_factors = dv(r.freq_factors);
    const double* inv = inv_freq(r.base, r.rope_dim);
    const int32_t* d_pos = stage(pos, n_tok);
    const int32_t nk = k ? n_head_kv : 0;
    key(4, q, k, d_pos, n_tok, n_head, nk, r.mode, r.head_dim, r.rope_dim, r.base, r.linear_scale,
        r.freq_factors, inv);
    run("rope", [=, this] { cuda::rope(ctx_, q, k, d_pos, n_tok, n_head, nk, r, inv); });
  }
  void swiglu(float* gate, const float* up, int64_t n) override {
    const bool q = quantizing(1, n);
    key(5, gate, up, n, q);
    run("swiglu", [=, this] { cuda::swiglu(ctx_, gate, up, n, xq(q)); });
    if (q) quantized_ = {gate, n};
  }
  void geglu(float* gate, const float* up, int64_t n) override {
    const bool q = quantizing(1, n);
    key(10, gate, up, n, q);
    run("geglu", [=, this] { cuda::geglu(ctx_, gate, up, n, xq(q)); });
    if (q) quantized_ = {gate, n};
  }
  void scale(float* x, float s, int64_t n) override {
    key(11, x, s, n);
    run("scale", [=, this] { cuda::scale(ctx_, x, s, n); });
  }
  void add(float* x, const float* y, int64_t n) override {
    key(6, x, y, n);
    run("add", [=, this] { cuda::add(ctx_, x, y, n); });
  }
  void sigmoid_mul(float* x, const float* gate, int64_t n) override {
    key(12, x, gate, n);
    run("sigmoid_mul", [=, this] { cuda::sigmoid_mul(ctx_, x, gate, n); });
  }
  void gated_delta_net(const DeltaNetArgs& a) override {
    DeltaNetArgs b = a;
    b.conv_w = dv(a.conv_w), b.dt_bias = dv(a.dt_bias), b.a = dv(a.a), b.norm = dv(a.norm);
    key(13, b.qkv, b.z, b.alpha, b.beta, b.y, b.conv_state, b.state, b.conv_w, b.dt_bias, b.a,
        b.norm, b.n_tok, b.conv, b.k_heads, b.v_heads, b.head, b.eps, b.chunk);
    run(a.chunk > 1 ? "delta net prefill" : "delta net decode",
        [=, this] { cuda::gated_delta_net(ctx_, b); });
  }
  void kv_write(const KvLayout& l, const float* k, const float* v, int32_t n_tok,
                uint8_t* const* pages, const int32_t* slots) override {
    uint8_t* const* d_pages = stage(pages, n_tok);
    const int32_t* d_slots = stage(slots, n_tok);
    key(7, k, v, n_tok, d_pages, d_slots);
    key_layout(l);
    run("kv_write", [=, this] { cuda::kv_write(ctx_, l, k, v, n_tok, d_pages, d_slots); });
  }
  // The q and k heads' norms in the same launch (heads of 64 or 128), else as two rmsnorm
  // launches before it; both give the same bits (CudaOps.RopeKvWriteWithHeadNorms).
  void rope_kv_write(float* q, float* k, const float* v, const int32_t* pos, int32_t n_tok,
                     int32_t n_head, const RopeParams& p, const KvLayout& l, uint8_t* const* pages,
                     const int32_t* slots, const QkNorm* norm) override {
    QkNorm n{};
    if (norm && (p.head_dim == 64 || p.head_dim == 128)) {
      n = {dv(norm->q), dv(norm->k), norm->eps};
    } else if (norm) {
      rmsnorm(q, norm->q, q, int64_t{n_tok} * n_head, p.head_dim, norm->eps);
      rmsnorm(k, norm->k, k, int64_t{n_tok} * l.n_head_kv, p.head_dim, norm->eps);
    }
    RopeParams r = p;
    if (r.freq_factors) r.freq_factors = dv(r.freq_factors);
    const double* inv = inv_freq(r.base, r.rope_dim);
    const int32_t* d_pos = stage(pos, n_tok);
    uint8_t* const* d_pages = stage(pages, n_tok);
    const int32_t* d_slots = stage(slots, n_tok);
    key(9, q, k, v, d_pos, n_tok, n_head, r.mode, r.head_dim, r.rope_dim, r.base, r.linear_scale,
        r.freq_factors, inv, d_pages, d_slots, n.q, n.k, n.eps);
    key_layout(l);
    run("rope_kv_write", [=, this] {
      cuda::rope_kv_write(ctx_, q, k, v, d_pos, n_tok, n_head, r, inv, l, d_pages, d_slots, n);
    });
  }
  void attention(const AttentionArgs& a) override {
    if (a.n_tok == 1 || a.n_tok > cuda::kMaxSliceTok) return attend(a, a.n_tok == 1);
    // A few tokens (a verify step's drafts): each through the one-token kernels, over the spans
    // it sees, so that its bits are the one-token step's (kMaxSliceTok).
    const size_t row = static_cast<size_t>(a.n_head) * a.kv.head_dim;
    for (int32_t t = 0; t < a.n_tok; ++t) {
      AttentionArgs b = a;
      b.n_tok = 1;
      b.q = a.q + t * row, b.out = a.out + t * row, b.acc = a.acc + 2 * t * a.n_head;
      b.pos = a.pos + t;
      const int32_t p = a.pos[t], from = a.window > 0 ? p - a.window + 1 : 0;
      while (b.n_spans > 0 && b.spans[b.n_spans - 1].start > p) --b.n_spans;
      while (b.n_spans > 0 && b.spans[0].start + b.spans[0].n <= from) ++b.spans, --b.n_spans;
      if (b.n_spans > 0 || b.last) attend(b, false);
    }
  }
  void attend(const AttentionArgs& a, bool may_quantize) {
    AttentionArgs b = a;
    b.spans = a.n_spans > 0 ? stage(a.spans, a.n_spans) : nullptr;
    b.pos = stage(a.pos, a.n_tok);
    const bool q = may_quantize && a.last &&
                   quantizing(1, static_cast<int64_t>(a.n_head) * a.kv.head_dim);
    const bool by_warp =
        a.n_tok == 1 && cuda::decode_by_warp(ctx_, a.kv, int64_t{a.pos[0]} + 1);
    between_ += static_cast<size_t>(a.n_spans) * a.kv.page_bytes();
    key(8, b.q, b.out, b.acc, b.pos, b.n_tok, b.spans, b.n_spans, b.n_head, b.scale, b.window,
        b.first, b.last, q, by_warp);
    key_layout(b.kv);
    run(a.n_tok == 1 ? "attention decode" : "attention prefill",
        [=, this] { cuda::attention(ctx_, b, xq(q), by_warp); });
    if (q) quantized_ = {b.out, static_cast<int64_t>(a.n_head) * a.kv.head_dim};
  }

  // Copies on the copy streams are timed by a pair of events each, for busy_seconds().
  void copy(Stream s, void* dst, const void* src, size_t n) override {
    cut();
    quantized_ = {};
    if (s == Stream::Compute) {
      KVS_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream(s)));
      return;
    }
    cuda::CopyTimes& ct = copy_times_[static_cast<int>(s)];
    const cudaEvent_t a = copy_events_.take(), b = copy_events_.take();
    KVS_CUDA_CHECK(cudaEventRecord(a, stream(s)));
    const bool paced = s == Stream::CopyIn && pacer_;  // --h2d-limit: host functions around it
    if (paced) {
      pacer_->issue(n);
      KVS_CUDA_CHECK(cudaLaunchHostFunc(
          stream(s), [](void* p) { static_cast<Pacer*>(p)->start(); }, pacer_.get()));
    }
    KVS_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream(s)));
    if (paced)
      KVS_CUDA_CHECK(cudaLaunchHostFunc(
          stream(s), [](void* p) { static_cast<Pacer*>(p)->hold_next(); }, pacer_.get()));
    KVS_CUDA_CHECK(cudaEventRecord(b, stream(s)));
    ct.open.push_back({a, b});
  }
  void limit_copy_in(double bytes_per_s) override {
    sync();  // no host function of the old pacer is pending
    pacer_ = std::make_unique<Pacer>(bytes_per_s);
  }
  FenceId make_fence() override {
    cudaEvent_t e;
    KVS_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    fences_.push_back(e);
    return static_cast<FenceId>(fences_.size() - 1);
  }
  void record(Stream s, FenceId f) override {
    cut();
    KVS_CUDA_CHECK(cudaEventRecord(fence(f), stream(s)));
  }
  // A compute wait is bracketed by timing events: the time between them is the stall.
  void wait(Stream s, FenceId f) override {
    cut();
    if (s != Stream::Compute) {
      KVS_CUDA_CHECK(cudaStreamWaitEvent(stream(s), fence(f), 0));
      return;
    }
    const cudaEvent_t a = copy_events_.take(), b = copy_events_.take();
    KVS_CUDA_CHECK(cudaEventRecord(a, stream(s)));
    KVS_CUDA_CHECK(cudaStreamWaitEvent(stream(s), fence(f), 0));
    KVS_CUDA_CHECK(cudaEventRecord(b, stream(s)));
    copy_times_[0].open.push_back({a, b});
  }
  double wait_seconds() override { return copy_times_[0].finished(copy_events_); }
  void wait_host(FenceId f) override { KVS_CUDA_CHECK(cudaEventSynchronize(fence(f))); }
  bool done(FenceId f) override {
    const cudaError_t e = cudaEventQuery(fence(f));
    if (e == cudaErrorNotReady) return false;
    KVS_CUDA_CHECK(e);
    return true;
  }
  // The time of the finished copies on s (one copy at a time per stream, so they add up).
  double busy_seconds(Stream s) override {
    return s == Stream::Compute ? 0.0 : copy_times_[static_cast<int>(s)].finished(copy_events_);
  }
  // Split attention: flags in pinned memory a kernel polls; the CPU's partials folded by the
  // decode's fold.
  FlagId make_flag() override { return flags_.make(); }
  void raise(FlagId f, uint64_t value) override { flags_.raise(f, value); }
  // A compute wait is bracketed by timing events, as a fence's: the device waiting for the CPU.
  void wait_flag(Stream s, FlagId f, uint64_t value) override {
    cut();
    flush_stage();
    if (s != Stream::Compute) {
      flags_.wait(stream(s), f, value);
      return;
    }
    const cudaEvent_t a = copy_events_.take(), b = copy_events_.take();
    KVS_CUDA_CHECK(cudaEventRecord(a, stream(s)));
    flags_.wait(stream(s), f, value);
    KVS_CUDA_CHECK(cudaEventRecord(b, stream(s)));
    flag_times_.open.push_back({a, b});
  }
  double flag_wait_seconds() override { return flag_times_.finished(copy_events_); }
  void fold(const AttentionArgs& a, const float* parts) override {
    cut();
    const bool q = a.last && quantizing(1, static_cast<int64_t>(a.n_head) * a.kv.head_dim);
    run("attention fold", [=, this] { cuda::fold_partials(ctx_, a, parts, xq(q)); });
    if (q) quantized_ = {a.out, static_cast<int64_t>(a.n_head) * a.kv.head_dim};
  }

  void sync() override {
    for (cudaStream_t s : streams_) KVS_CUDA_CHECK(cudaStreamSynchronize(s));
    KVS_CUDA_CHECK(cudaStreamSynchronize(ctx_.side));
    prof_.collect();
  }

  // A step is recorded: its operations are kept as calls, with a key of everything they
  // launch, and its staged inputs go over in one copy at its start. At its end a step with
  // the last step's key relaunches the last graph as it is (the usual decode step: only the
  // staged data differ, read from the same pinned addresses); any other is captured and
  // updates the graph in place, or instantiates it. Off by CudaOptions::graphs or profiling.
  void begin_step() override {
    if (!graphs_) return;
    KVS_CUDA_CHECK(cudaStreamSynchronize(streams_[0]));  // the last step read its staged data
    stage_off_ = flushed_ = 0;
    recording_ = true;
    calls_.clear();
    next_.clear();
    between_ = 0;
    key_.assign(1, gen_);
  }
  void end_step(bool run) override {
    if (!recording_) return;
    recording_ = false;
    std::swap(calls_, held_);  // held_ runs below; calls_ keeps its buffers for the next step
    calls_.clear();
    if (!run) return;
    key_.push_back(stage_off_);
    if (exec_ && !last_key_.empty() && key_ == last_key_) {
      KVS_CUDA_CHECK(cudaGraphLaunch(exec_, streams_[0]));
      return;
    }
    last_key_.clear();
    partial_ = false;
    ctx_.pause = [this] { pause_capture(); };
    ctx_.resume = [this] {
      KVS_CUDA_CHECK(cudaStreamBeginCapture(streams_[0], cudaStreamCaptureModeRelaxed));
    };
    cudaGraph_t g = nullptr;
    KVS_CUDA_CHECK(cudaStreamBeginCapture(streams_[0], cudaStreamCaptureModeRelaxed));
    try {
      launch(held_);
    } catch (...) {
      ctx_.pause = ctx_.resume = nullptr;
      cudaStreamEndCapture(streams_[0], &g);
      if (g) cudaGraphDestroy(g);
      cudaGetLastError();
      throw;
    }
    ctx_.pause = ctx_.resume = nullptr;
    KVS_CUDA_CHECK(cudaStreamEndCapture(streams_[0], &g));
    if (exec_ && !partial_) {
      cudaGraphExecUpdateResultInfo info{};
      if (cudaGraphExecUpdate(exec_, g, &info) != cudaSuccess) {
        cudaGetLastError();
        KVS_CUDA_CHECK(cudaGraphExecDestroy(exec_));
        exec_ = nullptr;
      }
    } else if (exec_) {
      KVS_CUDA_CHECK(cudaGraphExecDestroy(exec_));
      exec_ = nullptr;
    }
    if (!exec_) KVS_CUDA_CHECK(cudaGraphInstantiate(&exec_, g, 0));
    KVS_CUDA_CHECK(cudaGraphDestroy(g));
    KVS_CUDA_CHECK(cudaGraphLaunch(exec_, streams_[0]));
    if (!partial_) last_key_.swap(key_);  // a cut graph holds only the step's tail
  }

 private:
  static constexpr size_t kStage = size_t{8} << 20;

  cuda::PrefillScratch lent_;     // the geometry of what is lent, at lent_at_
  uint8_t* lent_at_ = nullptr;
  cuda::PrefillScratch prefill_;  // the geometry of the memory lend_prefill_scratch() is given

  // While a step is captured, a scratch buffer must grow: what was captured so far runs and
  // is waited for (the old buffer may be in use), then ctx_.resume captures on.
  void pause_capture() {
    cudaGraph_t g = nullptr;
    KVS_CUDA_CHECK(cudaStreamEndCapture(streams_[0], &g));
    cudaGraphExec_t run = nullptr;
    KVS_CUDA_CHECK(cudaGraphInstantiate(&run, g, 0));
    KVS_CUDA_CHECK(cudaGraphDestroy(g));
    KVS_CUDA_CHECK(cudaGraphLaunch(run, streams_[0]));
    KVS_CUDA_CHECK(cudaStreamSynchronize(streams_[0]));
    KVS_CUDA_CHECK(cudaGraphExecDestroy(run));
    partial_ = true;
  }

  cudaStream_t stream(Stream s) const { return streams_[static_cast<int>(s)]; }
  cudaEvent_t fence(FenceId f) const {
    KVS_CHECK(f >= 0 && static_cast<size_t>(f) < fences_.size(), "unknown fence ", f);
    return fences_[static_cast<size_t>(f)];
  }
  const float* dv(const float* host) const {
    auto it = placed_.vectors_at.find(host);
    return it == placed_.vectors_at.end() ? host : it->second;
  }
  // A device copy of n elements of a host array, ordered on the compute stream (in a
  // recorded step, by the step's one copy at its start).
  template <class T>
  const T* stage(const T* src, int64_t n) {
    const size_t bytes = static_cast<size_t>(n) * sizeof(T);
    KVS_CHECK(bytes <= kStage, "cuda: staging ", format_bytes(bytes), " at once");
    if (stage_off_ + bytes > kStage) {
      cut();
      flush_stage();
      KVS_CUDA_CHECK(cudaStreamSynchronize(streams_[0]));  // every earlier copy has been read
      stage_off_ = flushed_ = 0;
    }
    uint8_t* h = static_cast<uint8_t*>(stage_h_) + stage_off_;
    uint8_t* d = static_cast<uint8_t*>(stage_d_) + stage_off_;
    std::memcpy(h, src, bytes);
    stage_off_ += (bytes + 15) / 16 * 16;
    return reinterpret_cast<const T*>(d);
  }
  // The bytes staged since the last flush go to the device in the parameters of a kernel
  // launch: a cudaMemcpyAsync would queue on the host-to-device copy engine behind the ring's
  // multi-MiB copies and stall the compute stream for up to one of them.
  void flush_stage() {
    if (flushed_ < stage_off_)
      cuda::stage_bytes(streams_[0], static_cast<uint8_t*>(stage_d_) + flushed_,
                        static_cast<const uint8_t*>(stage_h_) + flushed_, stage_off_ - flushed_);
    flushed_ = stage_off_;
  }

  // An operation: launched now, or kept for the end of the recorded step.
  template <class F>
  void run(const char* name, F&& f) {
    quantized_ = {};  // whatever it writes, the quantized copy is of no use after it
    if (recording_) {
      calls_.add(f);
      return;
    }
    flush_stage();
    const Timed t(prof_, ctx_.stream, name);
    f();
  }
  // In a recorded step, the matrix-vector product before this one (n_tok <= kMaxVecTok) gets
  // this one's first l2_next_bytes_ as its L2 prefetch, unless the attention between them reads
  // more than L2 would keep. Returns this product's index in next_ (-1: not recorded).
  int next_product(const MatJob* jobs, int n_jobs, int64_t n_tok) {
    if (!recording_ || n_tok > cuda::kMaxVecTok || l2_next_bytes_ == 0) return -1;
    if (!next_.empty() && between_ <= (size_t{24} << 20)) {
      cuda::L2Next& nx = next_.back();
      size_t left = l2_next_bytes_;
      for (int i = 0; i < n_jobs && i < 4 && left > 0; ++i) {
        const Matrix& m = *jobs[i].w;
        const uintptr_t a = reinterpret_cast<uintptr_t>(m.data) & ~uintptr_t{127};
        const size_t bytes = std::min(left, static_cast<size_t>(m.n_out) * m.row_bytes);
        nx.p[nx.n] = reinterpret_cast<const uint8_t*>(a);
        nx.lines[nx.n++] = static_cast<uint32_t>((bytes + 127) / 128);
        left -= bytes;
      }
    }
    between_ = 0;
    next_.push_back({});
    return static_cast<int>(next_.size()) - 1;
  }
  // Whether an operation writing rows <= kMaxSliceTok of n elements also writes them quantized
  // into ctx_.xq for the integer matrix-vector kernel, which then skips quantizing its x (a
  // launch saved per product): when the buffer is that large already (it only grows, so it
  // still is when the operation runs). The pointer is read when the operation runs: a step's
  // recorded operations run later, maybe after it grew.
  bool quantizing(int64_t rows, int64_t n) const {
    return n % 32 == 0 && rows <= cuda::kMaxSliceTok &&
           ctx_.xq.size() >= cuda::xq_bytes(n, rows);
  }
  uint8_t* xq(bool q) { return q ? ctx_.xq.as() : nullptr; }

  // What an operation launches, appended to the recorded step's key.
  template <class... T>
  void key(const T&... v) {
    if (!recording_) return;
    const size_t n = key_.size();
    key_.resize(n + sizeof...(T));  // one size check for them all: a step has thousands
    uint64_t* w = key_.data() + n;
    ((*w++ = bits(v)), ...);
  }
  template <class T>
  static uint64_t bits(const T& v) {
    if constexpr (std::is_pointer_v<T>)
      return reinterpret_cast<uintptr_t>(v);
    else if constexpr (std::is_floating_point_v<T>)
      return std::bit_cast<uint64_t>(static_cast<double>(v));
    else
      return static_cast<uint64_t>(v);
  }
  void key_layout(const KvLayout& l) {
    key(l.k_type, l.v_type, l.page_size, l.n_head_kv, l.head_dim, l.k_row, l.v_row, l.k_head,
        l.v_head);
  }
  // Work that cannot be recorded (copies, fences): what the step recorded so far is launched
  // now, in order, and the rest of the step runs operation by operation.
  void cut() {
    if (!recording_) return;
    recording_ = false;
    std::swap(calls_, held_);
    calls_.clear();
    launch(held_);
  }
  // A recorded step's work, in order: its staged inputs in one copy, then its operations.
  void launch(const Calls& calls) {
    if (stage_off_ > 0)
      KVS_CUDA_CHECK(
          cudaMemcpyAsync(stage_d_, stage_h_, stage_off_, cudaMemcpyHostToDevice, streams_[0]));
    flushed_ = stage_off_;
    ctx_.staged = true;
    try {
      calls.run();
    } catch (...) {
      ctx_.staged = false;
      throw;
    }
    ctx_.staged = false;
  }
  // base^(-2i/d) for i < d/2 in double, computed here as the CPU backend does, once per
  // (base, d); rope multiplies it by the position.
  const double* inv_freq(float base, int32_t rope_dim) {
    DeviceBuffer& b = inv_freq_[{base, rope_dim}];
    if (b.size() == 0) {
      std::vector<double> f(static_cast<size_t>(rope_dim / 2));
      for (int32_t i = 0; i < rope_dim / 2; ++i)
        f[static_cast<size_t>(i)] = std::pow(static_cast<double>(base), -2.0 * i / rope_dim);
      b = alloc(std::max<size_t>(f.size(), 1) * sizeof(double), "rope frequencies");
      KVS_CUDA_CHECK(
          cudaMemcpy(b.as(), f.data(), f.size() * sizeof(double), cudaMemcpyHostToDevice));
    }
    return b.as<double>();
  }

  std::string name_;
  size_t capacity_ = 0, used_ = 0;
  std::mutex mu_;
  std::unordered_map<void*, size_t> sizes_;
  std::unordered_set<void*> host_;
  std::unordered_map<void*, size_t> managed_;
  bool limited_ = false;     // --vram-limit given
  size_t free0_ = 0;         // free device memory when the device was made
  bool said_ = false;        // the balloon was reported
  void* balloon_ = nullptr;  // what the limit takes away (unified mode)
  cudaStream_t streams_[kStreams] = {};
  std::vector<cudaEvent_t> fences_;
  Ctx ctx_;
  cuda::PlacedWeights placed_;
  cuda::CopyTimes copy_times_[kStreams];
  cuda::CopyTimes flag_times_;  // the compute stream's waits on flags
  EventPool copy_events_;
  cuda::Flags flags_;
  std::unique_ptr<Pacer> pacer_;  // --h2d-limit; the destructor's synchronize outlives its calls
  Profile prof_;
#ifdef KVS_TRACE
  cuda::TraceRing trace_;
#endif
  bool graphs_;
  // The activations that the last operation also wrote quantized into ctx_.xq (n elements).
  struct {
    const float* x = nullptr;
    int64_t n = 0;
  } quantized_;
  cudaGraphExec_t exec_ = nullptr;  // the last whole step, updated in place by the next
  bool partial_ = false;            // the step being captured was cut by a pause
  bool recording_ = false;
  Calls calls_, held_;  // the recorded step's operations; those being launched
  // What a product asks L2 to fetch of the next one at its end; next_: the recorded step's
  // products' requests; between_: K/V bytes attended since the last.
  size_t l2_next_bytes_;
  std::vector<cuda::L2Next> next_;
  size_t between_ = 0;
  std::vector<uint64_t> key_, last_key_;  // what they launch; last_key_: what exec_ runs
  uint64_t gen_ = 0;                      // bumped by every allocation and free
  std::map<std::pair<float, int32_t>, DeviceBuffer> inv_freq_;
  void* stage_h_ = nullptr;
  void* stage_d_ = nullptr;
  size_t stage_off_ = 0;
  size_t flushed_ = 0;  // staged bytes below this are on their way to the device
};

}  // namespace

std::unique_ptr<Device> make_cuda_device(size_t capacity, const CudaOptions& opt) {
  return std::make_unique<CudaDevice>(capacity, opt);
}

}  // namespace kvs
