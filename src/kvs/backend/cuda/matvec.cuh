// The matrix-vector kernels of matmul.cu (up to kMaxSliceTok tokens) and the launch that picks
// their shape (q_shape). A header so that bench/matvec_sweep.cu times every variant of the
// kernel the library runs; its contents have internal linkage, a copy in each program that
// includes it.
#pragma once

#include "kvs/backend/cuda/common.cuh"
#include "kvs/backend/cuda/iq4.cuh"
#include "kvs/backend/cuda/kernels.h"

namespace kvs::cuda {
namespace {

constexpr int kWarps = 4;  // warps per block
constexpr int kRows = 2;   // rows per warp in the f16/bf16 kernel
constexpr int kMaxJobs = 3;

// The jobs of one launch; rows of job j are [first[j], first[j + 1]) of the grid's rows.
struct Group {
  const uint8_t* w[kMaxJobs];
  size_t pitch[kMaxJobs];
  float* y[kMaxJobs];
  const float* bias[kMaxJobs];
  int n_out[kMaxJobs];
  int first[kMaxJobs + 1];
  bool add[kMaxJobs];
  int n;
  int split;  // warps that share a pair of rows, each taking every split-th group
};

template <DType T>
constexpr bool kQuant = packed(T).quant != 0;
template <DType T>
constexpr bool kHalf = T == DType::F16 || T == DType::BF16;

// What one lane holds of one f16/bf16 row and group of 1024 elements: elements
// 128 c + 4 lane + k (c < 8, k < 4), so its x reads are coalesced.
template <DType T>
struct Lane {
  uint32_t q[16];

  __device__ void load(const uint8_t* row, int gi, int lane, int n_in) {
    const int e0 = gi * 1024 + 4 * lane;
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      uint2 u = make_uint2(0, 0);
      if (e0 + 128 * c < n_in) u = __ldg(reinterpret_cast<const uint2*>(row) + (e0 + 128 * c) / 4);
      q[2 * c] = u.x, q[2 * c + 1] = u.y;
    }
  }
  // The 4 elements of chunk c.
  __device__ void chunk(int c, float* e) const {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const uint32_t w = q[2 * c + k];
      if constexpr (T == DType::F16) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w));
        e[2 * k] = f.x, e[2 * k + 1] = f.y;
      } else {
        e[2 * k] = __uint_as_float(w << 16), e[2 * k + 1] = __uint_as_float(w & 0xFFFF0000u);
      }
    }
  }
};

__device__ __forceinline__ void store(const Group& g, int j, int row, int t, float s) {
  const size_t i = static_cast<size_t>(t) * g.n_out[j] + row;
  const float v = s + (g.bias[j] ? g.bias[j][row] : 0.0f);
  g.y[j][i] = g.add[j] ? g.y[j][i] + v : v;
}

// A warp per block of x.
__global__ void quantize_x(const float* __restrict__ x, XBlock* __restrict__ xq,
                           XMeta* __restrict__ xm, int n_blocks) {
  pdl_wait();
  const int b = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (b >= n_blocks) return;
  quantize_x_block(x[static_cast<size_t>(b) * 32 + lane], lane, xq + b, xm + b);
}

// The end of a product kernel: each lane's sums over the lanes, then stored by lane 0 (split
// == 1), or, with split warps to each R rows, added up in warp order through shared memory by
// the first of them. With split > 1 the whole block must arrive here.
template <int R, int NT>
__device__ __forceinline__ void finish(const Group& g, int j, int row0, float (&acc)[R][NT],
                                       float (&red)[kWarps][R][NT], int split) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_out = g.n_out[j];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = warp_sum(acc[r][t]);
  if (split == 1) {
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t)
          if (row0 + r < n_out) store(g, j, row0 + r, t, acc[r][t]);
    return;
  }
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t) red[warp][r][t] = acc[r][t];
  __syncthreads();
  if (warp % split == 0 && lane < R * NT) {
    const int r = lane / NT, t = lane % NT;
    float v = 0.0f;
    for (int w = 0; w < split; ++w) v += red[warp + w][r][t];
    if (row0 + r < n_out) store(g, j, row0 + r, t, v);
  }
}

// x's block i (token t's block b: t * n_blocks + b) as one lane reads it: its two int8 planes
// as 8 words each into xh and xl, and its meta.
__device__ __forceinline__ float2 load_x(const XBlock* __restrict__ xq,
                                         const XMeta* __restrict__ xm, size_t i, int (&xh)[8],
                                         int (&xl)[8]) {
  const XBlock* xb = xq + i;
  const int4 h0 = __ldg(reinterpret_cast<const int4*>(xb->h)),
             h1 = __ldg(reinterpret_cast<const int4*>(xb->h) + 1);
  const int4 l0 = __ldg(reinterpret_cast<const int4*>(xb->l)),
             l1 = __ldg(reinterpret_cast<const int4*>(xb->l) + 1);
  const float2 m = __ldg(reinterpret_cast<const float2*>(xm + i));
  xh[0] = h0.x, xh[1] = h0.y, xh[2] = h0.z, xh[3] = h0.w;
  xh[4] = h1.x, xh[5] = h1.y, xh[6] = h1.z, xh[7] = h1.w;
  xl[0] = l0.x, xl[1] = l0.y, xl[2] = l0.z, xl[3] = l0.w;
  xl[4] = l1.x, xl[5] = l1.y, xl[6] = l1.z, xl[7] = l1.w;
  return m;
}

// The blocks of U groups of R rows, as one lane loads them: q4_0, q4_1, q8_0.
template <DType T, int R, int U>
struct QChunk {
  static constexpr Packed pk = packed(T);
  static constexpr int kWords = pk.quant / 4;
  uint32_t q[U][R][kWords];
  float d[U][R], mn[U][R];

  // Groups g0 + u gs (u < U) of the rows (lane's blocks past the row's end: zeros).
  __device__ __forceinline__ void load(const uint8_t* const* rows, int g0, int gs, int lane,
                                       int n_blocks) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const bool ok = (g0 + u * gs) * 32 + lane < n_blocks;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint8_t* grp = rows[r] + static_cast<size_t>(g0 + u * gs) * pk.stride();
        const uint8_t* sc = grp + 32 * pk.quant + 2 * lane;  // the block's scale
#pragma unroll
        for (int k = 0; k < kWords / 4; ++k) {
          const uint4 v = ok ? __ldg(reinterpret_cast<const uint4*>(grp + pk.quant * lane) + k)
                             : make_uint4(0, 0, 0, 0);
          q[u][r][4 * k] = v.x, q[u][r][4 * k + 1] = v.y, q[u][r][4 * k + 2] = v.z;
          q[u][r][4 * k + 3] = v.w;
        }
        d[u][r] = ok ? __half2float(__ldg(reinterpret_cast<const __half*>(sc))) : 0.0f;
        mn[u][r] = T == DType::Q4_1 && ok
                       ? __half2float(__ldg(reinterpret_cast<const __half*>(sc + 64)))
                       : 0.0f;
      }
    }
  }

  // acc[r][t] += the chunk's dot products with x of the NT tokens.
  template <int NT>
  __device__ __forceinline__ void dot(const XBlock* __restrict__ xq, const XMeta* __restrict__ xm,
                                      int g0, int gs, int lane, int n_blocks,
                                      float (&acc)[R][NT]) const {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int b = (g0 + u * gs) * 32 + lane;
      if (b >= n_blocks) continue;  // its quants and scales are zero
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        int xh[8], xl[8];
        const float2 m = load_x(xq, xm, static_cast<size_t>(t) * n_blocks + b, xh, xl);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          int sh = 0, sl = 0;
          if constexpr (T == DType::Q8_0) {
#pragma unroll
            for (int w = 0; w < 8; ++w) {
              sh = __dp4a(static_cast<int>(q[u][r][w]), xh[w], sh);
              sl = __dp4a(static_cast<int>(q[u][r][w]), xl[w], sl);
            }
          } else {  // byte j: element j in the low nibble, j + 16 in the high one
#pragma unroll
            for (int w = 0; w < 4; ++w) {
              const int lo = static_cast<int>(q[u][r][w] & 0x0F0F0F0Fu);
              const int hi = static_cast<int>((q[u][r][w] >> 4) & 0x0F0F0F0Fu);
              sh = __dp4a(lo, xh[w], sh), sh = __dp4a(hi, xh[w + 4], sh);
              sl = __dp4a(lo, xl[w], sl), sl = __dp4a(hi, xl[w + 4], sl);
            }
          }
          const float f = fmaf(static_cast<float>(sl), 1.0f / 254.0f, static_cast<float>(sh));
          if constexpr (T == DType::Q4_0)
            acc[r][t] = fmaf(d[u][r] * m.x, fmaf(-8.0f, m.y, f), acc[r][t]);
          else if constexpr (T == DType::Q4_1)
            acc[r][t] = fmaf(m.x, fmaf(d[u][r], f, mn[u][r] * m.y), acc[r][t]);
          else
            acc[r][t] = fmaf(d[u][r] * m.x, f, acc[r][t]);
        }
      }
    }
  }
};

// The sub-blocks (layout.h) of U groups of R rows, as one lane loads them: k-quants, iq4_xs and
// iq4_nl. The codes are dotted with x's planes per half of 16 elements where the halves scale
// apart; a level's offset and a half's min meet x's sum over the half (xs), once per token.
template <DType T, int R, int U>
struct SubChunk {
  static constexpr Packed pk = packed(T);
  Sub<T> s[U][R];

  __device__ __forceinline__ void load(const uint8_t* const* rows, int g0, int gs, int lane,
                                       int n_blocks) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const bool ok = (g0 + u * gs) * 32 + lane < n_blocks;
#pragma unroll
      for (int r = 0; r < R; ++r)
        s[u][r].load(rows[r] + static_cast<size_t>(g0 + u * gs) * pk.stride(), lane, ok);
    }
  }

  template <int NT>
  __device__ __forceinline__ void dot(const XBlock* __restrict__ xq, const XMeta* __restrict__ xm,
                                      int g0, int gs, int lane, int n_blocks,
                                      float (&acc)[R][NT]) const {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int b = (g0 + u * gs) * 32 + lane;
      if (b >= n_blocks) continue;  // its quants and scales are zero
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        int xh[8], xl[8];
        const float2 m = load_x(xq, xm, static_cast<size_t>(t) * n_blocks + b, xh, xl);
        int xs[2][2] = {};  // [plane h, l][half]: the sums of x's bytes
        if constexpr (kHalves<T>) {
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            xs[0][0] = __dp4a(xh[w], 0x01010101, xs[0][0]);
            xs[0][1] = __dp4a(xh[w + 4], 0x01010101, xs[0][1]);
            xs[1][0] = __dp4a(xl[w], 0x01010101, xs[1][0]);
            xs[1][1] = __dp4a(xl[w + 4], 0x01010101, xs[1][1]);
          }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
          int sh[2] = {}, sl[2] = {};  // [half]
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            uint32_t a, c;
            s[u][r].codes(w, a, c);
            sh[0] = __dp4a(static_cast<int>(a), xh[w], sh[0]);
            sh[1] = __dp4a(static_cast<int>(c), xh[w + 4], sh[1]);
            sl[0] = __dp4a(static_cast<int>(a), xl[w], sl[0]);
            sl[1] = __dp4a(static_cast<int>(c), xl[w + 4], sl[1]);
          }
          int sc[2], mn[2];
          float d, dmin;
          s[u][r].scales(lane % 8, sc, mn, d, dmin);
          if constexpr (kHalves<T>) {
            constexpr int o = kOffset<T>;
            const int ih = sc[0] * (sh[0] - o * xs[0][0]) + sc[1] * (sh[1] - o * xs[0][1]);
            const int il = sc[0] * (sl[0] - o * xs[1][0]) + sc[1] * (sl[1] - o * xs[1][1]);
            float v = d * fmaf(static_cast<float>(il), 1.0f / 254.0f, static_cast<float>(ih));
            if constexpr (kMin<T>) {
              const int mh = mn[0] * xs[0][0] + mn[1] * xs[0][1];
              const int ml = mn[0] * xs[1][0] + mn[1] * xs[1][1];
              v = fmaf(-dmin, fmaf(static_cast<float>(ml), 1.0f / 254.0f, static_cast<float>(mh)),
                       v);
            }
            acc[r][t] = fmaf(m.x, v, acc[r][t]);
          } else {
            const float f = fmaf(static_cast<float>(sl[0] + sl[1]), 1.0f / 254.0f,
                                 static_cast<float>(sh[0] + sh[1]));
            const float ds = d * static_cast<float>(sc[0]);
            if constexpr (kMin<T>)
              acc[r][t] =
                  fmaf(m.x, fmaf(ds, f, -(dmin * static_cast<float>(mn[0])) * m.y), acc[r][t]);
            else
              acc[r][t] = fmaf(ds * m.x, f, acc[r][t]);
          }
        }
      }
    }
  }
};

// iq4_xs and iq4_nl: SubChunk's loads. The levels of the R rows' codes (iq4_split) and their
// sub-blocks' scales first, then their dot products with x's words put in the codes' order
// (iq4_order): the compiler keeps fewer registers so than row by row, with a chunk loaded
// ahead too.
template <DType T, int R, int U>
struct Iq4Chunk : SubChunk<T, R, U> {
  using SubChunk<T, R, U>::s;

  template <int NT>
  __device__ __forceinline__ void dot(const XBlock* __restrict__ xq, const XMeta* __restrict__ xm,
                                      int g0, int gs, int lane, int n_blocks,
                                      float (&acc)[R][NT]) const {
    const uint32_t t0 = __ldg(&g_iq4_first[0]), t1 = __ldg(&g_iq4_first[1]);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int b = (g0 + u * gs) * 32 + lane;
      if (b >= n_blocks) continue;  // its quants and scales are zero
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        int xh[8], xl[8];
        const float2 m = load_x(xq, xm, static_cast<size_t>(t) * n_blocks + b, xh, xl);
        int lv[R][4][4];  // [row][quant word]: iq4_split's n[0], p[0], n[1], p[1]
        float ds[R];      // d times the sub-block's scale (iq4_nl: d)
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            int n[2], p[2];
            iq4_split(s[u][r].q[w], t0, t1, n, p);
            lv[r][w][0] = n[0], lv[r][w][1] = p[0], lv[r][w][2] = n[1], lv[r][w][3] = p[1];
          }
          ds[r] = h2f(s[u][r].hd[0]);
          if constexpr (T == DType::IQ4_XS) {
            // The scale + 32 (6 bits) into a float's mantissa: 2^23 + it, less 2^23 + 32.
            const int sb = lane % 8;
            const uint32_t bits = ((s[u][r].hd[1] >> (4 * sb)) & 15u) |
                                  ((s[u][r].hd[0] >> (12 + 2 * sb)) & 0x30u) | 0x4B000000u;
            ds[r] *= __uint_as_float(bits) - 8388640.0f;
          }
        }
        int ph[8], pl[8];
        iq4_order(xh, ph), iq4_order(xl, pl);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          int sh = 0, sl = 0;
#pragma unroll
          for (int w = 0; w < 4; ++w)
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              sh = __dp4a(lv[r][w][k], ph[2 * w + k / 2], sh);
              sl = __dp4a(lv[r][w][k], pl[2 * w + k / 2], sl);
            }
          const float f = fmaf(static_cast<float>(sl), 1.0f / 254.0f, static_cast<float>(sh));
          acc[r][t] = fmaf(ds[r] * m.x, f, acc[r][t]);
        }
      }
    }
  }
};

// This warp's share of the next product's lines, asked of L2 (no registers, no wait).
// The ranges are indexed by constants only (unused ones have no lines), so the parameter
// stays in constant memory instead of a copy on the stack.
__device__ __forceinline__ void prefetch_next(const L2Next& nx, int lane) {
  if (static_cast<int>(blockIdx.x) < nx.from_block) return;
  const uint32_t total = nx.lines[0] + nx.lines[1] + nx.lines[2] + nx.lines[3];
  const uint32_t parts = (gridDim.x - nx.from_block) * kWarps, per = (total + parts - 1) / parts;
  const uint32_t a = ((blockIdx.x - nx.from_block) * kWarps + threadIdx.x / 32) * per,
                 b = min(total, a + per);
  for (uint32_t i = a + lane; i < b; i += 32) {
    const uint8_t* p = nx.p[0];
    uint32_t off = i;
    int at = 0;  // the range of off
#pragma unroll
    for (int r = 0; r < 3; ++r)
      if (at == r && off >= nx.lines[r] && nx.lines[r + 1] > 0)
        off -= nx.lines[r], p = nx.p[r + 1], at = r + 1;
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p + static_cast<size_t>(off) * 128));
  }
}

template <DType T, int R, int U>
using Chunk =
    std::conditional_t<kIq4<T>, Iq4Chunk<T, R, U>,
                       std::conditional_t<kSubFormat<T>, SubChunk<T, R, U>, QChunk<T, R, U>>>;

// R rows per warp, g.split warps per R rows (warp part takes groups part, part + split, ...,
// U of them a chunk, summed through shared memory): a row's sums come in one order whatever U,
// R and the tokens, so the split alone, which q_shape picks by the matrix, sets a token's bits.
// The first chunk's weights are loaded before pdl_wait(): no kernel writes them, so their
// latency overlaps the kernel before. kPipe: the next chunk is loaded before the current one is
// used (twice the registers, no gap between the loads). kNext: at its end, asks L2 for the next
// product's first weights (nx; one token, in a recorded step), so the memory works while the
// small kernels between the two run.
template <DType T, int NT, int R, int U, bool kPipe, bool kNext = false>
__global__ void __launch_bounds__(kWarps * 32)
    matvec_q(Group g, const XBlock* __restrict__ xq, const XMeta* __restrict__ xm, int n_in,
             L2Next nx) {
  using C = Chunk<T, R, U>;
  __shared__ float red[kWarps][R][NT];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, split = g.split;
  const int r0 = (blockIdx.x * (kWarps / split) + warp / split) * R, part = warp % split;
  int j = 0;
  while (j + 1 < g.n && r0 >= g.first[j + 1]) ++j;
  const bool live = r0 < g.first[g.n];  // with split > 1 the whole block is live or not
  const int row0 = r0 - g.first[j], n_out = g.n_out[j], n_blocks = n_in / 32;
  const int n_groups = (n_blocks + 31) / 32, step = split * U;
  const uint8_t* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r)  // a row past the end re-reads the last one; not stored
    rows[r] = g.w[j] + static_cast<size_t>(min(row0 + r, n_out - 1)) * g.pitch[j];
  C c;
  if (live) c.load(rows, part, split, lane, n_blocks);
  pdl_wait();
  if (!live) return;
  float acc[R][NT] = {};
  for (int g0 = part; g0 < n_groups; g0 += step) {
    if constexpr (kPipe) {
      C next;
      next.load(rows, g0 + step, split, lane, n_blocks);  // zeros past the end
      c.template dot<NT>(xq, xm, g0, split, lane, n_blocks, acc);
      c = next;
    } else {
      if (g0 != part) c.load(rows, g0, split, lane, n_blocks);
      c.template dot<NT>(xq, xm, g0, split, lane, n_blocks, acc);
    }
  }
  if (kNext) prefetch_next(nx, lane);
  finish<R, NT>(g, j, row0, acc, red, split);
}

// f16 and bf16 rows: two per warp, lanes over the elements.
template <DType T, int NT>
__global__ void __launch_bounds__(kWarps * 32)
    matvec_fast(Group g, const float* __restrict__ x, int n_in) {
  pdl_wait();
  using L = Lane<T>;
  __shared__ float red[kWarps][kRows][NT];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, split = g.split;
  const int r0 = (blockIdx.x * (kWarps / split) + warp / split) * kRows, part = warp % split;
  int j = 0;
  while (j + 1 < g.n && r0 >= g.first[j + 1]) ++j;
  if (r0 >= g.first[g.n]) return;  // with split > 1 the whole block leaves together
  const int row0 = r0 - g.first[j], n_out = g.n_out[j], n_groups = (n_in + 1023) / 1024;
  const uint8_t* rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r)  // a row past the end re-reads the last one; not stored
    rows[r] = g.w[j] + static_cast<size_t>(min(row0 + r, n_out - 1)) * g.pitch[j];
  float acc[kRows][NT] = {};
#pragma unroll 2
  for (int gi = part; gi < n_groups; gi += split) {
    L w[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) w[r].load(rows[r], gi, lane, n_in);
    const float* xg = x + gi * 1024 + 4 * lane;
    const bool full = gi * 1024 + 1024 <= n_in;
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      float4 xv[NT];
#pragma unroll
      for (int t = 0; t < NT; ++t)
        xv[t] = full || gi * 1024 + 128 * c + 4 * lane < n_in
                    ? __ldg(reinterpret_cast<const float4*>(xg + static_cast<size_t>(t) * n_in +
                                                            128 * c))
                    : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float e[4];
        w[r].chunk(c, e);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          float a = e[0] * xv[t].x;
          a = fmaf(e[1], xv[t].y, a), a = fmaf(e[2], xv[t].z, a), a = fmaf(e[3], xv[t].w, a);
          acc[r][t] += a;
        }
      }
    }
  }
  finish<kRows, NT>(g, j, row0, acc, red, split);
}

// Any format: a warp per row, each lane decoding whole sub-blocks.
template <DType T, int NT>
__global__ void __launch_bounds__(kWarps * 32)
    matvec_any(Group g, const float* __restrict__ x, int n_in) {
  pdl_wait();
  const int r0 = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  int j = 0;
  while (j + 1 < g.n && r0 >= g.first[j + 1]) ++j;
  if (r0 >= g.first[g.n]) return;
  const int row = r0 - g.first[j];
  if (row >= g.n_out[j]) return;
  const uint8_t* r = g.w[j] + static_cast<size_t>(row) * g.pitch[j];
  float acc[NT] = {};
  const int n_sub = n_in / 32;
  for (int sb = lane; sb < n_sub; sb += 32) {
    float v[32];
    load_w<T>(r, n_sub, sb, v);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float4* xp =
          reinterpret_cast<const float4*>(x + static_cast<size_t>(t) * n_in + sb * 32);
      float s = 0.0f;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float4 xv = __ldg(xp + k);
        s = fmaf(v[4 * k], xv.x, s);
        s = fmaf(v[4 * k + 1], xv.y, s);
        s = fmaf(v[4 * k + 2], xv.z, s);
        s = fmaf(v[4 * k + 3], xv.w, s);
      }
      acc[t] += s;
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float s = warp_sum(acc[t]);
    if (lane == 0) store(g, j, row, t, s);
  }
}

// Jobs [0, n) of one weight type as a Group, each job's rows rounded up to per.
Group make_group(const MatJob* jobs, int n, int per) {
  Group g{};
  g.n = n;
  for (int j = 0; j < n; ++j) {
    const Matrix& w = *jobs[j].w;
    g.w[j] = w.data, g.pitch[j] = w.row_bytes, g.y[j] = jobs[j].y, g.bias[j] = jobs[j].bias;
    g.n_out[j] = static_cast<int>(w.n_out), g.add[j] = jobs[j].add;
    g.first[j + 1] = g.first[j] + (g.n_out[j] + per - 1) / per * per;
  }
  return g;
}

template <DType T, int NT, int R, int U, bool P>
void launch_q(Ctx& c, const MatJob* jobs, int n, int split, const XBlock* xq, const XMeta* xm,
              int n_in) {
  Group g = make_group(jobs, n, R);
  g.split = split;
  const int per_block = kWarps / split * R, blocks = (g.first[n] + per_block - 1) / per_block;
  if constexpr (NT == 1)
    if (c.next.n != 0) {
      L2Next nx = c.next;
      nx.from_block =
          std::max(0, blocks - resident(matvec_q<T, NT, R, U, P, true>, kWarps * 32, 0) * c.n_sm);
      return launch(matvec_q<T, NT, R, U, P, true>, blocks, kWarps * 32, 0, c.stream, g, xq, xm,
                    n_in, nx);
    }
  launch(matvec_q<T, NT, R, U, P>, blocks, kWarps * 32, 0, c.stream, g, xq, xm, n_in, L2Next{});
}

// The integer kernel's shape for rows of n_in (rows in all, n_tok tokens, bytes per sub-block
// and lane): R rows per warp share x's loads; U groups per chunk, kPipe, and split warps per R
// rows set the loads in flight and the warps on the GPU. Chosen by timing the variants for the
// 8B shapes (bench/matvec_sweep.cu): for one or two tokens, 8 rows per warp for 4-bit
// rows (4 for 8-bit ones, whose loads are twice as large), 4 for the smallest matrices; long
// rows (the FFN's down product) one group ahead; two warps per R rows. Formats of fewer bytes
// (q3_k, q2_k) take 8 rows always, more (q5_k, q6_k) 4, so the loads in flight stay alike;
// with two tokens the formats of sub-block scales (Sub), holding more registers a row, take 4.
// iq4, timed on Qwen3.5 27B's matrices: at one token one group ahead, two warps per 8 rows in
// matrices of up to 8192 rows and a warp per 4 rows in larger ones (more warps on the GPU).
struct QShape {
  int r, u, split;
  bool pipe;
};
constexpr bool eight_rows(int bytes, bool sub, int64_t n_tok) {
  return bytes <= 16 && n_tok <= 2 && !(sub && n_tok > 1);
}
QShape q_shape(int rows, int n_in, int64_t n_tok, int bytes, bool sub, bool iq4) {
  // Not by n_tok: a verify step's rows must be the one-token step's bits (batch invariance).
  if (iq4) {
    const int split = rows <= 8192 ? 2 : 1;
    if (n_tok == 1) return {split == 2 ? 8 : 4, 1, split, true};
    return n_in > 8192 ? QShape{4, 1, split, true} : QShape{4, 2, split, false};
  }
  const int split = n_in > 8192 || bytes <= 16 || rows <= 4096 || rows >= 16384 ? 2 : 1;
  const int r = eight_rows(bytes, sub, n_tok) && (bytes < 16 || rows > 4096) ? 8 : 4;
  if (n_in > 8192) return {r, 1, split, true};
  return {r, 2, split, false};
}

template <DType T, int NT>
void matvec_q_any(Ctx& c, const MatJob* jobs, int n, const XBlock* xq, const XMeta* xm, int n_in,
                  QShape s) {
  if constexpr (eight_rows(packed(T).lane_bytes(), kSubFormat<T>, NT)) {
    if (s.r == 8)
      return s.pipe ? launch_q<T, NT, 8, 1, true>(c, jobs, n, s.split, xq, xm, n_in)
                    : launch_q<T, NT, 8, 2, false>(c, jobs, n, s.split, xq, xm, n_in);
  }
  if (s.pipe)
    launch_q<T, NT, 4, 1, true>(c, jobs, n, s.split, xq, xm, n_in);
  else
    launch_q<T, NT, 4, 2, false>(c, jobs, n, s.split, xq, xm, n_in);
}

// One launch for jobs [0, n) of one weight type; xq/xm hold x quantized for matvec_q.
void matvec(Ctx& c, const float* x, int64_t n_tok, const MatJob* jobs, int n, const XBlock* xq,
            const XMeta* xm) {
  const DType type = jobs[0].w->type;
  const int n_in = static_cast<int>(jobs[0].w->n_in);
  int rows = 0;
  for (int j = 0; j < n; ++j) rows += static_cast<int>(jobs[j].w->n_out);
  dispatch(type, [&]<DType T>() {
    if constexpr (kQuant<T>) {
      const QShape s = q_shape(rows, n_in, n_tok, packed(T).lane_bytes(), kSubFormat<T>, kIq4<T>);
      switch (n_tok) {
#define KVS_NT(N) \
  case N:         \
    return matvec_q_any<T, N>(c, jobs, n, xq, xm, n_in, s);
        KVS_NT(1) KVS_NT(2) KVS_NT(3) KVS_NT(4) KVS_NT(5) KVS_NT(6) KVS_NT(7) KVS_NT(8)
#undef KVS_NT
      }
      return;
    }
    const int per = kHalf<T> ? kRows : 1;  // rows per warp
    Group g = make_group(jobs, n, per);
    // f16/bf16 rows of 4096 or more elements: the 4 warps of a block share a pair of rows.
    g.split = kHalf<T> && n_in >= 4096 ? kWarps : 1;
    const int per_block = kWarps / g.split;
    const unsigned grid = static_cast<unsigned>((g.first[n] / per + per_block - 1) / per_block);
    switch (n_tok) {
#define KVS_NT(N)                                                            \
  case N:                                                                    \
    if constexpr (kHalf<T>)                                                  \
      launch(matvec_fast<T, N>, grid, kWarps * 32, 0, c.stream, g, x, n_in); \
    else                                                                     \
      launch(matvec_any<T, N>, grid, kWarps * 32, 0, c.stream, g, x, n_in);  \
    break;
      KVS_NT(1) KVS_NT(2) KVS_NT(3) KVS_NT(4) KVS_NT(5) KVS_NT(6) KVS_NT(7) KVS_NT(8)
#undef KVS_NT
    }
  });
}

}  // namespace
}  // namespace kvs::cuda
