// Attention over spans with partials, continuing a running state across calls exactly as the
// CPU kernel does: each span gives per head (max, sum, unnormalised output), folded into the
// state in logical span order. Decode: one block per (span, kv head) computes the partials of
// the heads of its group, then one block per head folds them. Prefill: one block per (query,
// head) walks the spans in order. K/V are dequantized in 32-element sub-blocks as they are read.
#include "kvs/backend/cuda/common.cuh"
#include "kvs/backend/cuda/kernels.h"

namespace kvs::cuda {
namespace {

constexpr int kThreads = 128;

// KV rows have no alignment beyond two bytes: f16 is read element by element.
template <DType T>
__device__ __forceinline__ void load_kv(const uint8_t* row, int sb, float* v) {
  if constexpr (T == DType::F16) {
#pragma unroll
    for (int j = 0; j < 32; ++j) v[j] = h2f(row + 64 * sb + 2 * j);
  } else {
    load_sub<T>(row, sb, v);
  }
}

struct Geo {
  const float* q;
  float* out;
  float* acc;
  const Span* spans;
  const int32_t* pos;
  int n_spans, n_head, group, d;
  size_t k_row, v_row, k_head, v_head, v_offset;
  float scale;
  bool first, last;
};

__device__ float block_reduce(float v, float* red, bool is_max) {
  v = is_max ? warp_max(v) : warp_sum(v);
  const int w = threadIdx.x / 32, nw = blockDim.x / 32;
  __syncthreads();
  if (threadIdx.x % 32 == 0) red[w] = v;
  __syncthreads();
  float r = red[0];
  for (int i = 1; i < nw; ++i) r = is_max ? fmaxf(r, red[i]) : r + red[i];
  return r;
}

// Partial of the heads [h0, h0 + ng) over keys [0, n) of one span, all sharing kv head hk:
// scores to sc[g][j], then (m, l) and o[g][d] into the out pointers. qs holds the queries.
template <DType K, DType V>
__device__ void span_partial(const Geo& g, const Span& sp, int hk, int n, int ng, const float* qs,
                             float* sc, float* red, float* ored, int P, float* m_out, float* l_out,
                             float* o_out /* [ng][d], shared */) {
  const int d = g.d, n_sb = d / 32;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    float s[8] = {};
    const uint8_t* kr = sp.page + static_cast<size_t>(j) * g.k_row + hk * g.k_head;
    for (int sb = 0; sb < n_sb; ++sb) {
      float v[32];
      load_kv<K>(kr, sb, v);
      for (int gi = 0; gi < ng; ++gi) {
        const float* q = qs + gi * d + sb * 32;
        float a = 0.0f;
#pragma unroll
        for (int k = 0; k < 32; ++k) a = fmaf(q[k], v[k], a);
        s[gi] += a;
      }
    }
    for (int gi = 0; gi < ng; ++gi) sc[gi * P + j] = s[gi] * g.scale;
  }
  __syncthreads();
  const int n_ks = blockDim.x / n_sb;
  const int sb = threadIdx.x % n_sb, ks = threadIdx.x / n_sb;
  for (int gi = 0; gi < ng; ++gi) {
    float* s = sc + gi * P;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, s[j]);
    m = block_reduce(m, red, true);
    float l = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      const float p = expf(s[j] - m);
      s[j] = p;
      l += p;
    }
    l = block_reduce(l, red, false);  // its barriers also publish the p values
    float o[32] = {};
    if (ks < n_ks)
      for (int j = ks; j < n; j += n_ks) {
        float v[32];
        load_kv<V>(sp.page + g.v_offset + static_cast<size_t>(j) * g.v_row + hk * g.v_head, sb, v);
        const float p = s[j];
#pragma unroll
        for (int k = 0; k < 32; ++k) o[k] = fmaf(p, v[k], o[k]);
      }
    if (ks < n_ks)
#pragma unroll
      for (int k = 0; k < 32; ++k) ored[ks * d + sb * 32 + k] = o[k];
    __syncthreads();
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
      float a = 0.0f;
      for (int r = 0; r < n_ks; ++r) a += ored[r * d + i];
      o_out[gi * d + i] = a;
    }
    if (threadIdx.x == 0) m_out[gi] = m, l_out[gi] = l;
    __syncthreads();
  }
}

// Decode, step 1: partials of one span for the heads of one kv head.
template <DType K, DType V>
__global__ void __launch_bounds__(kThreads) decode_partials(Geo g, float* part, int P) {
  extern __shared__ float smem[];
  const int s = blockIdx.x, hk = blockIdx.y, d = g.d, ng = g.group;
  float* qs = smem;              // [ng][d]
  float* sc = qs + ng * d;       // [ng][P]
  float* ored = sc + ng * P;     // [n_ks][d]
  float* os = ored + kThreads / (d / 32) * d;  // [ng][d]
  float* red = os + ng * d;      // [32]
  float* ml = red + 32;          // [2][ng]
  const Span sp = g.spans[s];
  const int n = min(sp.n, g.pos[0] - sp.start + 1);
  for (int i = threadIdx.x; i < ng * d; i += blockDim.x) qs[i] = g.q[hk * ng * d + i];
  __syncthreads();
  const size_t stride = static_cast<size_t>(d) + 3;
  if (n <= 0) {
    for (int gi = threadIdx.x; gi < ng; gi += blockDim.x)
      part[(static_cast<size_t>(s) * g.n_head + hk * ng + gi) * stride + 2] = 0.0f;
    return;
  }
  span_partial<K, V>(g, sp, hk, n, ng, qs, sc, red, ored, P, ml, ml + ng, os);
  for (int i = threadIdx.x; i < ng * (d + 3); i += blockDim.x) {
    const int gi = i / (d + 3), k = i % (d + 3);
    float* p = part + (static_cast<size_t>(s) * g.n_head + hk * ng + gi) * stride;
    p[k] = k == 0 ? ml[gi] : k == 1 ? ml[ng + gi] : k == 2 ? 1.0f : os[gi * d + k - 3];
  }
}

// Decode, step 2: fold the partials of every span into the running state, in span order.
__global__ void decode_fold(Geo g, const float* part) {
  const int h = blockIdx.x, d = g.d;
  const size_t stride = static_cast<size_t>(d) + 3;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float m = g.first ? 0.0f : g.acc[2 * h], l = g.first ? 0.0f : g.acc[2 * h + 1];
    float o = l != 0.0f ? g.out[h * d + i] : 0.0f;
    for (int s = 0; s < g.n_spans; ++s) {
      const float* p = part + (static_cast<size_t>(s) * g.n_head + h) * stride;
      if (p[2] == 0.0f) continue;
      if (l == 0.0f) {
        m = p[0], l = p[1], o = p[3 + i];
        continue;
      }
      const float mm = fmaxf(m, p[0]);
      const float a = expf(m - mm), b = expf(p[0] - mm);
      l = l * a + p[1] * b;
      o = o * a + p[3 + i] * b;
      m = mm;
    }
    g.out[h * d + i] = g.last ? o / l : o;
    if (i == 0) g.acc[2 * h] = m, g.acc[2 * h + 1] = l;
  }
}

// Prefill: one block per (query, head), spans in order, the state kept in shared memory.
template <DType K, DType V>
__global__ void __launch_bounds__(kThreads) prefill(Geo g, int P) {
  extern __shared__ float smem[];
  const int t = blockIdx.x, h = blockIdx.y, d = g.d, hk = h / g.group;
  float* qs = smem;
  float* sc = qs + d;
  float* ored = sc + P;
  float* os = ored + kThreads / (d / 32) * d;
  float* red = os + d;
  float* ml = red + 32;
  const size_t qoff = (static_cast<size_t>(t) * g.n_head + h) * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) qs[i] = g.q[qoff + i];
  float m = g.first ? 0.0f : g.acc[2 * (t * g.n_head + h)];
  float l = g.first ? 0.0f : g.acc[2 * (t * g.n_head + h) + 1];
  float o[2] = {0.0f, 0.0f};  // elements threadIdx.x and threadIdx.x + kThreads (d <= 256)
  for (int r = 0; r < 2; ++r) {
    const int i = threadIdx.x + r * kThreads;
    if (i < d && l != 0.0f) o[r] = g.out[qoff + i];
  }
  __syncthreads();
  const int pos = g.pos[t];
  for (int s = 0; s < g.n_spans; ++s) {
    const Span sp = g.spans[s];
    if (sp.start > pos) break;
    const int n = min(sp.n, pos - sp.start + 1);
    span_partial<K, V>(g, sp, hk, n, 1, qs, sc, red, ored, P, ml, ml + 1, os);
    const float pm = ml[0], pl = ml[1];
    for (int r = 0; r < 2; ++r) {
      const int i = threadIdx.x + r * kThreads;
      if (i >= d) continue;
      if (l == 0.0f) {
        o[r] = os[i];
      } else {
        const float mm = fmaxf(m, pm);
        o[r] = o[r] * expf(m - mm) + os[i] * expf(pm - mm);
      }
    }
    if (l == 0.0f) {
      m = pm, l = pl;
    } else {
      const float mm = fmaxf(m, pm);
      l = l * expf(m - mm) + pl * expf(pm - mm);
      m = mm;
    }
    __syncthreads();
  }
  for (int r = 0; r < 2; ++r) {
    const int i = threadIdx.x + r * kThreads;
    if (i < d) g.out[qoff + i] = g.last ? o[r] / l : o[r];
  }
  if (threadIdx.x == 0) g.acc[2 * (t * g.n_head + h)] = m, g.acc[2 * (t * g.n_head + h) + 1] = l;
}

}  // namespace

void attention(Ctx& c, const AttentionArgs& a) {
  const KvLayout& l = a.kv;
  const int d = l.head_dim, P = l.page_size;
  KVS_CHECK(d % 32 == 0 && d <= 256, "cuda attention: head size ", d, " (32 to 256, multiple of 32)");
  KVS_CHECK(P <= 2048, "cuda attention: --page-size ", P, " is above 2048");
  Geo g{a.q, a.out, a.acc, a.spans, a.pos, a.n_spans, a.n_head, a.n_head / l.n_head_kv, d,
        l.k_row, l.v_row, l.k_head, l.v_head, l.v_offset(), a.scale, a.first, a.last};
  KVS_CHECK(g.group <= 8, "cuda attention: more than 8 query heads per kv head");
  const int n_ks = kThreads / (d / 32);
  if (a.n_tok == 1) {
    if (a.n_spans > 0) {
      float* part = c.scratch_part(static_cast<size_t>(a.n_spans) * a.n_head * (d + 3));
      const size_t smem = sizeof(float) * (2 * g.group * d + g.group * P + n_ks * d + 32 + 2 * g.group);
      dispatch_kv(l.k_type, [&]<DType K>() {
        dispatch_kv(l.v_type, [&]<DType V>() {
          auto k = decode_partials<K, V>;
          KVS_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(smem)));
          k<<<dim3(a.n_spans, l.n_head_kv), kThreads, smem, c.stream>>>(g, part, P);
        });
      });
      KVS_CUDA_CHECK(cudaGetLastError());
      decode_fold<<<a.n_head, d, 0, c.stream>>>(g, part);
    } else {
      decode_fold<<<a.n_head, d, 0, c.stream>>>(g, nullptr);
    }
    KVS_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const size_t smem = sizeof(float) * (2 * d + P + n_ks * d + 32 + 2);
  dispatch_kv(l.k_type, [&]<DType K>() {
    dispatch_kv(l.v_type, [&]<DType V>() {
      auto k = prefill<K, V>;
      KVS_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
      k<<<dim3(a.n_tok, a.n_head), kThreads, smem, c.stream>>>(g, P);
    });
  });
  KVS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kvs::cuda
