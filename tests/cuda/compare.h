// What the CUDA operation tests share: a CUDA device (or none, to skip), random inputs, device
// buffers read back, the normalised difference of two results, and a paged cache's spans and
// queries for the attention.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "kvs/backend/cuda/backend.h"
#include "kvs/backend/device.h"
#include "kvs/util/error.h"

namespace kvs {

inline std::unique_ptr<Device> cuda_or_null(const CudaOptions& o = {}) {
  try {
    return make_cuda_device(0, o);
  } catch (const Error&) {
    return nullptr;
  }
}

inline std::vector<float> rnd(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// A device buffer holding `v`, and its contents read back.
struct Buf {
  Device& dev;
  DeviceBuffer b;
  size_t n;
  Buf(Device& d, const std::vector<float>& v)
      : dev(d), b(d.alloc(v.size() * 4 + 4, "test")), n(v.size()) {
    dev.upload(b.as(), v.data(), n * 4);
  }
  Buf(Device& d, size_t n_) : dev(d), b(d.alloc(n_ * 4 + 4, "test")), n(n_) {}
  float* f() { return b.as<float>(); }
  std::vector<float> get() {
    std::vector<float> v(n);
    dev.sync();
    dev.download(v.data(), b.as(), n * 4);
    return v;
  }
};

inline double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 1e-9, d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    s = std::max(s, std::fabs(static_cast<double>(a[i])));
    d = std::max(d, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  }
  return d / s;
}

// The pages of a cache of ctx keys (the last page cut short) as spans over the CPU's copy and
// over the GPU's copy of them.
inline std::pair<std::vector<Span>, std::vector<Span>> page_spans(const uint8_t* cpu_pages,
                                                                  const uint8_t* gpu_pages,
                                                                  const KvLayout& l, int ctx) {
  std::vector<Span> c, g;
  const int P = l.page_size;
  for (int p = 0; p * P < ctx; ++p) {
    const int n = std::min(P, ctx - p * P);
    c.push_back({cpu_pages + p * l.page_bytes(), p * P, n});
    g.push_back({gpu_pages + p * l.page_bytes(), p * P, n});
  }
  return {c, g};
}

// The positions of the last n_tok queries of a context of ctx keys.
inline std::vector<int32_t> last_positions(int ctx, int n_tok) {
  std::vector<int32_t> pos(n_tok);
  for (int t = 0; t < n_tok; ++t) pos[t] = ctx - n_tok + t;
  return pos;
}

// Attention of the queries at `pos` over a cache of layout l (spans, q, out and acc to set).
inline AttentionArgs attention_args(const KvLayout& l, const std::vector<int32_t>& pos, int n_head,
                                    float scale) {
  AttentionArgs a;
  a.pos = pos.data();
  a.n_tok = static_cast<int32_t>(pos.size());
  a.kv = l;
  a.n_head = n_head;
  a.scale = scale;
  return a;
}

#define NEED_GPU()                            \
  auto gpu = cuda_or_null();                  \
  if (!gpu) GTEST_SKIP() << "no CUDA device"; \
  auto cpu = make_cpu_device(0);

}  // namespace kvs
