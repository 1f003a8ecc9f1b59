// Element-wise and row operations of the forward pass: embedding, RMSNorm, rope, SwiGLU and
// GeGLU, scaling, qwen35's sigmoid gate, residual add, and the KV write that quantizes new rows
// into their pages (the same rounding as the CPU quantizers).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kvs/backend/cuda/common.cuh"
#include "kvs/backend/cuda/kernels.h"

namespace kvs::cuda {
namespace {

inline unsigned blocks(size_t n, unsigned t) {
  return static_cast<unsigned>((n + t - 1) / t);
}

template <DType T>
__global__ void embed_k(const uint8_t* __restrict__ emb, size_t row_bytes, const int32_t* ids,
                        int n_in, float* __restrict__ x) {
  pdl_wait();
  const int t = blockIdx.y, n_sub = n_in / 32;
  const int sb = blockIdx.x * blockDim.x + threadIdx.x;
  if (sb >= n_sub) return;
  float v[32];
  load_w<T>(emb + static_cast<size_t>(ids[t]) * row_bytes, n_sub, sb, v);
  float* o = x + static_cast<size_t>(t) * n_in + sb * 32;
#pragma unroll
  for (int j = 0; j < 32; ++j) o[j] = v[j];
}

// xq, xm: y quantized too (n a multiple of 32: each warp's 32 elements are one block).
__global__ void rmsnorm_k(const float* __restrict__ x, const float* __restrict__ w,
                          float* __restrict__ y, int n, float eps, XBlock* __restrict__ xq,
                          XMeta* __restrict__ xm) {
  pdl_wait();
  const float* xr = x + static_cast<size_t>(blockIdx.x) * n;
  float* yr = y + static_cast<size_t>(blockIdx.x) * n;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
  __shared__ float part[32];
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float s = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.0f;
    s = warp_sum(s);
    if (threadIdx.x == 0) part[0] = s;
  }
  __syncthreads();
  const float scale = rsqrtf(part[0] / static_cast<float>(n) + eps);
  // x and y may be the same rows (q/k norms): each element is read and written by one thread.
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = xr[i] * scale * w[i];
    yr[i] = v;
    if (xq) {
      const size_t b = (static_cast<size_t>(blockIdx.x) * n + i) / 32;
      quantize_x_block(v, threadIdx.x % 32, xq + b, xm + b);
    }
  }
}

// RMSNorm of a row of n elements (a multiple of kNormPart) by n / kNormPart blocks: each
// reads the whole row for the sum of squares (in one order, so all get the same sum) and
// writes its part, so that a row's loads are in flight at once (one block per row would wait
// on them in turn).
// The part's weights are read before pdl_wait(): no kernel writes them.
constexpr int kNormThreads = 256, kNormPart = 2 * kNormThreads;
__global__ void __launch_bounds__(kNormThreads)
    rmsnorm_wide(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                 int n, float eps, XBlock* __restrict__ xq, XMeta* __restrict__ xm) {
  const int tid = threadIdx.x, p0 = blockIdx.y * kNormPart;
  const float w0 = w[p0 + tid], w1 = w[p0 + kNormThreads + tid];
  pdl_wait();
  const float* xr = x + static_cast<size_t>(blockIdx.x) * n;
  float ss = 0.0f;
  for (int i = tid; i < n / 4; i += kNormThreads) {
    const float4 v = reinterpret_cast<const float4*>(xr)[i];
    ss = fmaf(v.x, v.x, ss), ss = fmaf(v.y, v.y, ss), ss = fmaf(v.z, v.z, ss);
    ss = fmaf(v.w, v.w, ss);
  }
  __shared__ float part[kNormThreads / 32];
  ss = warp_sum(ss);
  if (tid % 32 == 0) part[tid / 32] = ss;
  __syncthreads();
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kNormThreads / 32; ++k) sum += part[k];
  const float scale = rsqrtf(sum / static_cast<float>(n) + eps);
#pragma unroll
  for (int it = 0; it < 2; ++it) {
    const int e = p0 + it * kNormThreads + tid;
    const float v = xr[e] * scale * (it ? w1 : w0);
    y[static_cast<size_t>(blockIdx.x) * n + e] = v;
    if (xq) {
      const size_t b = (static_cast<size_t>(blockIdx.x) * n + e) / 32;
      quantize_x_block(v, tid % 32, xq + b, xm + b);
    }
  }
}

// Rope: the angles of a token at position p, cs[2 i] = cos and cs[2 i + 1] = sin of pair i
// (computed in double, as the CPU), by the block's threads; and a pair's rotation, without
// contraction into fmas so that every kernel rounds it alike.
__device__ void rope_angles(float* cs, int32_t p, int half, float linear_scale,
                            const double* __restrict__ inv, const float* __restrict__ factors) {
  const double ppos = static_cast<double>(p) / static_cast<double>(linear_scale);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    double th = ppos * inv[i];
    if (factors) th /= static_cast<double>(factors[i]);
    double s, c;
    sincos(th, &s, &c);
    cs[2 * i] = static_cast<float>(c);
    cs[2 * i + 1] = static_cast<float>(s);
  }
}
__device__ __forceinline__ void rotate(float* v, int a, int b, const float* cs, int j) {
  const float x0 = v[a], x1 = v[b], co = cs[2 * j], si = cs[2 * j + 1];
  v[a] = __fsub_rn(__fmul_rn(x0, co), __fmul_rn(x1, si));
  v[b] = __fadd_rn(__fmul_rn(x0, si), __fmul_rn(x1, co));
}
// Heads [h0, h0 + kRopeHeads) of n_head of token t of x rotated in place.
constexpr int kRopeHeads = 4;
__device__ void rope_heads(float* x, int t, int h0, int n_head, int head_dim, int half, bool neox,
                           const float* cs) {
  const int nh = min(kRopeHeads, n_head - h0);
  for (int i = threadIdx.x; i < nh * half; i += blockDim.x) {
    const int j = i % half;
    rotate(x + (static_cast<size_t>(t) * n_head + h0 + i / half) * head_dim, neox ? j : 2 * j,
           neox ? j + half : 2 * j + 1, cs, j);
  }
}

// Rope of q and k: a block per token and kRopeHeads heads (q's blocks, then k's). One block per
// token did all heads in turn.
__global__ void rope_k(float* __restrict__ q, float* __restrict__ k,
                       const int32_t* __restrict__ pos, int n_head_q, int n_head_k, int head_dim,
                       int half, bool neox, float linear_scale, const double* __restrict__ inv,
                       const float* __restrict__ factors) {
  pdl_wait();
  extern __shared__ float cs[];  // [half][2]
  const int qb = (n_head_q + kRopeHeads - 1) / kRopeHeads, is_k = blockIdx.y >= qb;
  rope_angles(cs, pos[blockIdx.x], half, linear_scale, inv, factors);
  __syncthreads();
  rope_heads(is_k ? k : q, blockIdx.x, (is_k ? blockIdx.y - qb : blockIdx.y) * kRopeHeads,
             is_k ? n_head_k : n_head_q, head_dim, half, neox, cs);
}

__global__ void swiglu_k(float* __restrict__ g, const float* __restrict__ u, size_t n,
                         XBlock* __restrict__ xq, XMeta* __restrict__ xm) {
  pdl_wait();
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {  // with xq, n is a multiple of 32: whole warps pass
    const float a = g[i], v = a / (1.0f + expf(-a)) * u[i];
    g[i] = v;
    if (xq) quantize_x_block(v, threadIdx.x % 32, xq + i / 32, xm + i / 32);
  }
}

// gelu's tanh form, as the CPU backend computes it.
__global__ void geglu_k(float* __restrict__ g, const float* __restrict__ u, size_t n,
                        XBlock* __restrict__ xq, XMeta* __restrict__ xm) {
  pdl_wait();
  constexpr float kC = 0.7978845608028654f;  // sqrt(2 / pi)
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {  // with xq, n is a multiple of 32: whole warps pass
    const float a = g[i], v = 0.5f * a * (1.0f + tanhf(kC * (a + 0.044715f * a * a * a))) * u[i];
    g[i] = v;
    if (xq) quantize_x_block(v, threadIdx.x % 32, xq + i / 32, xm + i / 32);
  }
}

__global__ void scale_k(float* __restrict__ x, float s, size_t n) {
  pdl_wait();
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= s;
}

__global__ void sigmoid_mul_k(float* __restrict__ x, const float* __restrict__ gate, size_t n) {
  pdl_wait();
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] / (1.0f + expf(-gate[i]));
}

__global__ void add_k(float* __restrict__ x, const float* __restrict__ y, size_t n) {
  pdl_wait();
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] += y[i];
}

// Block blk of a head's slice of a K or V row (page.h: a quantized slice holds its nb blocks'
// scales, then their quants), x -> type T, by one warp (lane j holds element j); the same
// arithmetic as the CPU quantizers. Every f16 in a KV row is 2-byte aligned.
template <DType T>
__device__ void quantize_block(float x, uint8_t* head, int blk, int nb, int lane) {
  if constexpr (T == DType::F16) {
    reinterpret_cast<__half*>(head + 64 * blk)[lane] = __float2half_rn(x);
  } else if constexpr (T == DType::Q8_0) {
    const float d = warp_max(fabsf(x)) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    if (lane == 0) reinterpret_cast<__half*>(head)[blk] = __float2half_rn(d);
    const float s = __fmul_rn(x, id);  // no contraction into an fma: the CPU rounds twice
    head[2 * nb + 32 * blk + lane] =
        static_cast<uint8_t>(static_cast<int8_t>(truncf(s + copysignf(0.49999997f, s))));
  } else if constexpr (T == DType::Q4_0) {
    // The signed value of the first element of largest magnitude.
    float a = fabsf(x);
    int at = lane;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float b = __shfl_xor_sync(0xffffffffu, a, o);
      const int bt = __shfl_xor_sync(0xffffffffu, at, o);
      if (b > a || (b == a && bt < at)) a = b, at = bt;
    }
    const float max = __shfl_sync(0xffffffffu, x, at);
    const float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    if (lane == 0) reinterpret_cast<__half*>(head)[blk] = __float2half_rn(d);
    const int q = min(15, static_cast<int>(__fadd_rn(__fmul_rn(x, id), 8.5f)));
    const int hi = __shfl_down_sync(0xffffffffu, q, 16);
    if (lane < 16) head[2 * nb + 16 * blk + lane] = static_cast<uint8_t>(q | (hi << 4));
  }
}

// A warp per 32-element block of K (blocks [0, nb)) or V ([nb, 2 nb)) of token blockIdx.y;
// a row's block i is block i % hb of head i / hb.
template <DType K, DType V>
__global__ void kv_write_k(const float* __restrict__ k, const float* __restrict__ v, int dim,
                           int hb, uint8_t* const* pages, const int32_t* slots, size_t v_offset,
                           size_t k_row, size_t v_row, size_t k_head, size_t v_head) {
  pdl_wait();
  const int t = blockIdx.y, nb = dim / 32, lane = threadIdx.x % 32;
  const int i = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (i >= 2 * nb) return;
  uint8_t* page = pages[t];
  const size_t s = static_cast<size_t>(slots[t]);
  if (i < nb)
    quantize_block<K>(k[static_cast<size_t>(t) * dim + i * 32 + lane],
                      page + s * k_row + i / hb * k_head, i % hb, hb, lane);
  else
    quantize_block<V>(v[static_cast<size_t>(t) * dim + (i - nb) * 32 + lane],
                      page + v_offset + s * v_row + (i - nb) / hb * v_head, (i - nb) % hb, hb,
                      lane);
}

// Rows [0, nr) of n <= 128 elements at x normalized in place, by a block of 128 threads two
// rows at a time, as rmsnorm_k computes them with 64 threads a row (each thread's sum of squares
// over the same elements, the same warp sums and the same sum of the two warps' sums: the same
// bits).
__device__ void head_norms(float* x, int nr, int n, const float* __restrict__ w, float eps) {
  __shared__ float part[4], tot[2];
  const int tid = threadIdx.x, r = tid / 64, lt = tid % 64;
  for (int r0 = 0; r0 < nr; r0 += 2) {
    const bool on = r0 + r < nr;
    float* xr = x + static_cast<size_t>(r0 + r) * n;
    float ss = 0.0f;
    if (on)
      for (int i = lt; i < n; i += 64) ss = fmaf(xr[i], xr[i], ss);
    ss = warp_sum(ss);
    if (tid % 32 == 0) part[tid / 32] = ss;
    __syncthreads();
    if (lt < 32) {
      float s = lt < 2 ? part[2 * r + lt] : 0.0f;
      s = warp_sum(s);
      if (lt == 0) tot[r] = s;
    }
    __syncthreads();
    if (on) {
      const float scale = rsqrtf(tot[r] / static_cast<float>(n) + eps);
      for (int i = lt; i < n; i += 64) xr[i] = xr[i] * scale * w[i];
    }
    __syncthreads();  // the rows are read by other threads next; part and tot are reused
  }
}

// Rope and the KV write in one launch: blocks [0, qb) of token blockIdx.x rotate q's heads as
// rope_k does; block qb + h takes kv head h, rotates its k in shared memory (and in k, as rope
// leaves it) and writes it and v into the page, a warp per 32-element block as kv_write_k.
// kNorm: the heads are normalized in place first (qwen3's q and k norms, weights qn and kn).
struct RopeKv {
  float* q;
  float* k;
  const float* v;
  const int32_t* pos;
  int n_head, n_head_kv, head_dim, half;
  bool neox;
  float linear_scale;
  const double* inv;
  const float* factors;
  uint8_t* const* pages;
  const int32_t* slots;
  size_t v_offset, k_row, v_row, k_head, v_head;
};
template <DType K, DType V, bool kNorm>
__global__ void rope_kv_k(const RopeKv a, const float* __restrict__ qn,
                          const float* __restrict__ kn, float eps) {
  pdl_wait();
  extern __shared__ float cs[];  // [half][2], then the kv head's k [head_dim]
  const int t = blockIdx.x, qb = (a.n_head + kRopeHeads - 1) / kRopeHeads, d = a.head_dim;
  rope_angles(cs, a.pos[t], a.half, a.linear_scale, a.inv, a.factors);
  if (static_cast<int>(blockIdx.y) < qb) {
    const int h0 = blockIdx.y * kRopeHeads;
    if constexpr (kNorm)
      head_norms(a.q + (static_cast<size_t>(t) * a.n_head + h0) * d, min(kRopeHeads, a.n_head - h0),
                 d, qn, eps);
    __syncthreads();
    return rope_heads(a.q, t, h0, a.n_head, d, a.half, a.neox, cs);
  }
  const int h = blockIdx.y - qb, nb = d / 32, lane = threadIdx.x % 32;
  const size_t row = static_cast<size_t>(t) * a.n_head_kv + h;
  if constexpr (kNorm) head_norms(a.k + row * d, 1, d, kn, eps);
  float* ks = cs + 2 * a.half;
  for (int i = threadIdx.x; i < d; i += blockDim.x) ks[i] = a.k[row * d + i];
  __syncthreads();
  for (int j = threadIdx.x; j < a.half; j += blockDim.x) {
    const int ia = a.neox ? j : 2 * j, ib = a.neox ? j + a.half : 2 * j + 1;
    rotate(ks, ia, ib, cs, j);
    a.k[row * d + ia] = ks[ia], a.k[row * d + ib] = ks[ib];
  }
  __syncthreads();
  uint8_t* page = a.pages[t];
  const size_t s = static_cast<size_t>(a.slots[t]);
  for (int i = threadIdx.x / 32; i < 2 * nb; i += blockDim.x / 32) {  // whole warps
    if (i < nb)
      quantize_block<K>(ks[32 * i + lane], page + s * a.k_row + h * a.k_head, i, nb, lane);
    else
      quantize_block<V>(a.v[row * d + 32 * (i - nb) + lane],
                        page + a.v_offset + s * a.v_row + h * a.v_head, i - nb, nb, lane);
  }
}

// Kernel parameters of up to kWords 16-byte words (32 KiB in all since CUDA 12.1, Volta on).
template <int kWords>
struct StageArgs {
  uint4* dst;
  int n;
  uint4 w[kWords];
};
template <int kWords>
__global__ void stage_k(const __grid_constant__ StageArgs<kWords> a) {
  pdl_wait();
  for (int i = threadIdx.x; i < a.n; i += blockDim.x) a.dst[i] = a.w[i];
}
template <int kWords>
void stage_launch(cudaStream_t stream, uint8_t* dst, const uint8_t* src, int words) {
  StageArgs<kWords> a;
  a.dst = reinterpret_cast<uint4*>(dst);
  a.n = words;
  std::memcpy(a.w, src, static_cast<size_t>(words) * 16);
  launch(stage_k<kWords>, 1, 256, 0, stream, a);
}

}  // namespace

void stage_bytes(cudaStream_t stream, uint8_t* dst, const uint8_t* src, size_t n) {
  KVS_CHECK(n % 16 == 0, "cuda: staging ", n, " bytes (not a multiple of 16)");
  constexpr int kMax = 2040;  // 32,640 bytes of words, under the 32,764-byte parameter limit
  for (size_t done = 0; done < n;) {
    const int words = static_cast<int>(std::min<size_t>(kMax, (n - done) / 16));
    // Three sizes, so a few staged positions do not launch 32 KiB of parameters.
    if (words <= 16)
      stage_launch<16>(stream, dst + done, src + done, words);
    else if (words <= 256)
      stage_launch<256>(stream, dst + done, src + done, words);
    else
      stage_launch<kMax>(stream, dst + done, src + done, words);
    done += static_cast<size_t>(words) * 16;
  }
}

void embed(Ctx& c, const Matrix& emb, const int32_t* ids, int32_t n, float* x) {
  const int n_sub = static_cast<int>(emb.n_in / 32);
  const dim3 grid(blocks(static_cast<size_t>(n_sub), 64), static_cast<unsigned>(n));
  dispatch(emb.type, [&]<DType T>() {
    launch(embed_k<T>, grid, 64, 0, c.stream, emb.data, emb.row_bytes, ids,
           static_cast<int>(emb.n_in), x);
  });
}

// The two parts of a buffer of x quantized (n elements).
static std::pair<XBlock*, XMeta*> xq_parts(uint8_t* xq, size_t n) {
  if (!xq) return {nullptr, nullptr};
  return {reinterpret_cast<XBlock*>(xq), reinterpret_cast<XMeta*>(xq + n / 32 * sizeof(XBlock))};
}

void rmsnorm(Ctx& c, const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps,
             uint8_t* xq) {
  KVS_CHECK(!xq || n % 32 == 0, "cuda: rmsnorm quantizing rows of ", n, " elements");
  const auto [xb, xm] = xq_parts(xq, static_cast<size_t>(rows * n));
  // Few rows, not in place (the blocks of a row all read it whole).
  if (x != y && rows <= kMaxSliceTok && n % kNormPart == 0 && n >= 4 * kNormPart) {
    launch(rmsnorm_wide, dim3(static_cast<unsigned>(rows), static_cast<unsigned>(n / kNormPart)),
           kNormThreads, 0, c.stream, x, w, y, static_cast<int>(n), eps, xb, xm);
    return;
  }
  const unsigned t = n >= 1024 ? 1024 : (n >= 256 ? 256 : 64);
  launch(rmsnorm_k, static_cast<unsigned>(rows), t, 0, c.stream, x, w, y, static_cast<int>(n), eps,
         xb, xm);
}

void rope(Ctx& c, float* q, float* k, const int32_t* pos, int32_t n_tok, int32_t n_head,
          int32_t n_head_kv, const RopeParams& p, const double* inv) {
  const int half = p.rope_dim / 2;
  const auto blocks = [](int32_t heads) { return (heads + kRopeHeads - 1) / kRopeHeads; };
  const dim3 grid(static_cast<unsigned>(n_tok),
                  static_cast<unsigned>(blocks(n_head) + blocks(n_head_kv)));
  launch(rope_k, grid, 128, sizeof(float) * 2 * half, c.stream, q, k, pos, n_head, n_head_kv,
         p.head_dim, half, p.mode == RopeMode::Neox, p.linear_scale, inv, p.freq_factors);
}

void rope_kv_write(Ctx& c, float* q, float* k, const float* v, const int32_t* pos, int32_t n_tok,
                   int32_t n_head, const RopeParams& p, const double* inv, const KvLayout& l,
                   uint8_t* const* pages, const int32_t* slots, const QkNorm& norm) {
  KVS_CHECK(!norm.q || l.head_dim == 64 || l.head_dim == 128, "cuda: q/k norms of heads of ",
            l.head_dim, " in the rope's launch (64 or 128)");
  const RopeKv a{q,
                 k,
                 v,
                 pos,
                 n_head,
                 l.n_head_kv,
                 l.head_dim,
                 p.rope_dim / 2,
                 p.mode == RopeMode::Neox,
                 p.linear_scale,
                 inv,
                 p.freq_factors,
                 pages,
                 slots,
                 l.v_offset(),
                 l.k_row,
                 l.v_row,
                 l.k_head,
                 l.v_head};
  const dim3 grid(static_cast<unsigned>(n_tok),
                  static_cast<unsigned>((n_head + kRopeHeads - 1) / kRopeHeads + l.n_head_kv));
  const size_t smem = sizeof(float) * (2 * static_cast<size_t>(a.half) + l.head_dim);
  dispatch_kv(l.k_type, [&]<DType K>() {
    dispatch_kv(l.v_type, [&]<DType V>() {
      if (norm.q)
        launch(rope_kv_k<K, V, true>, grid, 128, smem, c.stream, a, norm.q, norm.k, norm.eps);
      else
        launch(rope_kv_k<K, V, false>, grid, 128, smem, c.stream, a, nullptr, nullptr, 0.0f);
    });
  });
}

void swiglu(Ctx& c, float* gate, const float* up, int64_t n, uint8_t* xq) {
  KVS_CHECK(!xq || n % 32 == 0, "cuda: swiglu quantizing ", n, " elements");
  const auto [xb, xm] = xq_parts(xq, static_cast<size_t>(n));
  launch(swiglu_k, blocks(static_cast<size_t>(n), 256), 256, 0, c.stream, gate, up,
         static_cast<size_t>(n), xb, xm);
}

void geglu(Ctx& c, float* gate, const float* up, int64_t n, uint8_t* xq) {
  KVS_CHECK(!xq || n % 32 == 0, "cuda: geglu quantizing ", n, " elements");
  const auto [xb, xm] = xq_parts(xq, static_cast<size_t>(n));
  launch(geglu_k, blocks(static_cast<size_t>(n), 256), 256, 0, c.stream, gate, up,
         static_cast<size_t>(n), xb, xm);
}

void scale(Ctx& c, float* x, float s, int64_t n) {
  launch(scale_k, blocks(static_cast<size_t>(n), 256), 256, 0, c.stream, x, s,
         static_cast<size_t>(n));
}

void sigmoid_mul(Ctx& c, float* x, const float* gate, int64_t n) {
  launch(sigmoid_mul_k, blocks(static_cast<size_t>(n), 256), 256, 0, c.stream, x, gate,
         static_cast<size_t>(n));
}

void add(Ctx& c, float* x, const float* y, int64_t n) {
  launch(add_k, blocks(static_cast<size_t>(n), 256), 256, 0, c.stream, x, y,
         static_cast<size_t>(n));
}

void kv_write(Ctx& c, const KvLayout& l, const float* k, const float* v, int32_t n_tok,
              uint8_t* const* pages, const int32_t* slots) {
  const int dim = l.n_head_kv * l.head_dim;
  const dim3 grid(blocks(static_cast<size_t>(2 * dim / 32), 4), static_cast<unsigned>(n_tok));
  dispatch_kv(l.k_type, [&]<DType K>() {
    dispatch_kv(l.v_type, [&]<DType V>() {
      launch(kv_write_k<K, V>, grid, 128, 0, c.stream, k, v, dim, l.head_dim / 32, pages, slots,
             l.v_offset(), l.k_row, l.v_row, l.k_head, l.v_head);
    });
  });
}

#ifdef KVS_TRACE
KVS_TRACE_BIND(trace_bind_ops)
#endif

}  // namespace kvs::cuda
