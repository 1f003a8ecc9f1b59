// Attention over spans, continuing a running state (max, sum, unnormalised output) across
// calls exactly as the CPU kernel does, so a run that sees its spans in several calls (the
// ring's chunks) computes the same operations as one that sees them at once.
// Decode: one warp (decode_tc, tensor cores, head sizes 64 and 128) or block (decode_partials,
// CUDA cores, the others) per (span, kv head) computes the partial of every query head of the
// group, then a warp per (head, 32 dimensions) folds the partials into the state in span order
// (decode_fold; inside decode_tc's launch when it takes a warp per span; a call of one span on
// tensor cores folds in its own warp). Prefill: blocks of query
// rows (query, head) of one kv head walk the spans in tiles with an online softmax over tiles
// (prefill_tc on tensor cores over f16 tiles, a quantized cache converted to f16 first; prefill on
// CUDA cores for head sizes 32 and 256); a tile never crosses a span, so the sequence of operations
// does not depend on how the spans were split into calls.
#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "kvs/backend/cuda/common.cuh"
#include "kvs/backend/cuda/kernels.h"

namespace kvs::cuda {
namespace {

struct Geo {
  const float* q;
  float* out;
  float* acc;
  const Span* spans;
  const int32_t* pos;
  int n_tok, n_spans, n_head, group, d;
  size_t k_row, v_row, k_head, v_head, v_offset;
  float scale;
  bool first, last;
  uint8_t* xq = nullptr;       // decode, last call: where the fold also writes out quantized
  bool fold_in_place = false;  // decode of one span on tensor cores: no separate fold
};

// A decode partial of one (span, query head): [max, sum, non-empty, unused, output[d]], rows
// 16-byte aligned (d % 32 == 0) so the fold copies them in 16-byte pieces.
constexpr int kPartO = 4;
__host__ __device__ constexpr size_t part_stride(int d) {
  return static_cast<size_t>(d) + kPartO;
}

__device__ __forceinline__ float h2f_16(const uint16_t* p) {
  return __half2float(__ushort_as_half(*p));
}

// A quantized head's slice (page.h): the f16 scale of block b, and where its quants begin (nb:
// the head's blocks).
__device__ __forceinline__ float kv_scale(const uint8_t* head, int b) {
  return h2f_16(reinterpret_cast<const uint16_t*>(head) + b);
}
template <DType T>
__device__ __forceinline__ const uint8_t* kv_quants(const uint8_t* head, int nb, int b) {
  return head + 2 * nb + (T == DType::Q8_0 ? 32 : 16) * b;
}

// 32 elements [32 sb, 32 sb + 32) of one head's K or V row of nb blocks; every f16 in a KV row
// is 2-byte aligned, so the reads are 16-bit.
template <DType T>
__device__ __forceinline__ void kv_sub(const uint8_t* row, int nb, int sb, float* v) {
  if constexpr (T == DType::F16) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(row + 64 * sb);
#pragma unroll
    for (int j = 0; j < 32; ++j) v[j] = h2f_16(p + j);
  } else if constexpr (T == DType::Q8_0) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(kv_quants<T>(row, nb, sb));
    const float d = kv_scale(row, sb);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const uint16_t w = p[j];
      v[2 * j] = d * static_cast<float>(static_cast<int8_t>(w & 0xFF));
      v[2 * j + 1] = d * static_cast<float>(static_cast<int8_t>(w >> 8));
    }
  } else {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(kv_quants<T>(row, nb, sb));
    const float d = kv_scale(row, sb);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint16_t w = p[j];
      v[2 * j] = d * static_cast<float>((w & 0xF) - 8);
      v[2 * j + 1] = d * static_cast<float>(((w >> 8) & 0xF) - 8);
      v[2 * j + 16] = d * static_cast<float>(((w >> 4) & 0xF) - 8);
      v[2 * j + 17] = d * static_cast<float>((w >> 12) - 8);
    }
  }
}

// Elements [e, e + n) (n <= kN, e a multiple of n, n dividing 32) of one head's V row of nb
// blocks.
template <DType T, int kN>
__device__ __forceinline__ void kv_elems(const uint8_t* row, int nb, int e, int n, float* v) {
  const int b = e / 32, o = e % 32;
  if constexpr (T == DType::F16) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(row) + e;
#pragma unroll
    for (int k = 0; k < kN; ++k)
      if (k < n) v[k] = h2f_16(p + k);
  } else if constexpr (T == DType::Q8_0) {
    const uint8_t* q = kv_quants<T>(row, nb, b);
    const float d = kv_scale(row, b);
#pragma unroll
    for (int k = 0; k < kN; ++k)
      if (k < n) v[k] = d * static_cast<float>(static_cast<int8_t>(q[o + k]));
  } else {
    const uint8_t* q = kv_quants<T>(row, nb, b);
    const float d = kv_scale(row, b);
    const int sh = o < 16 ? 0 : 4, base = o % 16;
#pragma unroll
    for (int k = 0; k < kN; ++k)
      if (k < n) v[k] = d * static_cast<float>(((q[base + k] >> sh) & 0xF) - 8);
  }
}

// Eight consecutive elements [e, e + 8) (e a multiple of 8) of one head's K row of nb blocks,
// with 16-bit loads (every f16 of a KV row is 2-byte aligned).
template <DType T>
__device__ __forceinline__ void kv_oct(const uint8_t* row, int nb, int e, float* v) {
  if constexpr (T == DType::F16) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(row) + e;
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = h2f_16(p + j);
  } else if constexpr (T == DType::Q8_0) {
    const float d = kv_scale(row, e / 32);
    const uint16_t* p = reinterpret_cast<const uint16_t*>(kv_quants<T>(row, nb, e / 32) + e % 32);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint16_t w = p[j];
      v[2 * j] = d * static_cast<float>(static_cast<int8_t>(w & 0xFF));
      v[2 * j + 1] = d * static_cast<float>(static_cast<int8_t>(w >> 8));
    }
  } else {
    const int o = e % 32, sh = o < 16 ? 0 : 4;
    const float d = kv_scale(row, e / 32);
    const uint16_t* p = reinterpret_cast<const uint16_t*>(kv_quants<T>(row, nb, e / 32) + o % 16);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t w = p[j] >> sh;
      v[2 * j] = d * static_cast<float>(static_cast<int>(w & 0xF) - 8);
      v[2 * j + 1] = d * static_cast<float>(static_cast<int>((w >> 8) & 0xF) - 8);
    }
  }
}

// Eight consecutive elements [e, e + 8) (e a multiple of 8) of one head's K or V row in
// shared memory, as f16: the integer levels become exact halves by the 0x6400 trick (a byte b
// in the low half of 0x64bb is 1024 + b) and one multiplication by the block's scale rounds
// d * q to f16 exactly as converting the f32 product does. No integer-to-float conversions.
__device__ __forceinline__ uint32_t h2_sub_mul(uint32_t u, __half2 off, __half2 d) {
  const __half2 h = __hmul2(__hsub2(*reinterpret_cast<const __half2*>(&u), off), d);
  return *reinterpret_cast<const uint32_t*>(&h);
}
template <DType T>
__device__ __forceinline__ uint4 dequant8(const uint8_t* row, int nb, int e) {
  if constexpr (T == DType::F16) {
    return *reinterpret_cast<const uint4*>(row + 2 * e);  // rows are 16-byte aligned in smem
  } else {
    constexpr bool q8 = T == DType::Q8_0;
    const int o = e % 32;
    const uint16_t* q =
        reinterpret_cast<const uint16_t*>(kv_quants<T>(row, nb, e / 32) + (q8 ? o : o % 16));
    uint32_t w0 = q[0] | (static_cast<uint32_t>(q[1]) << 16);
    uint32_t w1 = q[2] | (static_cast<uint32_t>(q[3]) << 16);
    if constexpr (q8) {
      w0 ^= 0x80808080u, w1 ^= 0x80808080u;  // signed levels + 128
    } else {
      const int sh = o < 16 ? 0 : 4;
      w0 = (w0 >> sh) & 0x0F0F0F0Fu, w1 = (w1 >> sh) & 0x0F0F0F0Fu;
    }
    const __half2 d = __half2half2(reinterpret_cast<const __half*>(row)[e / 32]);
    const __half2 off = __float2half2_rn(q8 ? 1152.0f : 1032.0f);
    uint4 r;
    r.x = h2_sub_mul(__byte_perm(w0, 0x64646464u, 0x4140), off, d);
    r.y = h2_sub_mul(__byte_perm(w0, 0x64646464u, 0x4342), off, d);
    r.z = h2_sub_mul(__byte_perm(w1, 0x64646464u, 0x4140), off, d);
    r.w = h2_sub_mul(__byte_perm(w1, 0x64646464u, 0x4342), off, d);
    return r;
  }
}

// Asynchronous copies global -> shared of w = 4, 8 or 16 bytes (both addresses aligned to w);
// w = 2 copies synchronously.
__device__ __forceinline__ void cp_async(void* dst, const void* src, int w) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if (w == 2)  // rows only 2-byte aligned (q4_0 rows of 32 elements): a plain copy
    *static_cast<uint16_t*>(dst) = *static_cast<const uint16_t*>(src);
  else if (w == 16)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
  else if (w == 8)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(d), "l"(src));
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src));
}
// Rows [0, n) of w pieces of cw bytes each, from src (rows src_stride apart) to shared dst
// (rows dst_stride apart); thread tid of nt takes every nt-th piece. A piece's row and column
// advance by adding: a division by the runtime w per piece cost more than the copy.
__device__ __forceinline__ void cp_rows(uint8_t* dst, int dst_stride, const uint8_t* src,
                                        size_t src_stride, int n, int w, int cw, int tid, int nt) {
  int r = tid / w, c = tid % w;
  const int dr = nt / w, dc = nt % w;
  for (; r < n; r += dr, c += dc) {
    if (c >= w) c -= w, ++r;
    if (r >= n) break;
    cp_async(dst + r * dst_stride + c * cw, src + r * src_stride + c * cw, cw);
  }
}
// The tensor-core kernels copy a head's raw rows in pieces of cw bytes from the cw-aligned
// address at or below the row's start (cw = 16 whenever whole K and V rows are 16-byte
// aligned, however a head sits in them: a q8_0 head of 136 bytes is 9 pieces, not 17 of 8
// bytes); the head's bytes then begin `shift` bytes into its copy. Heads at aligned offsets
// have shift 0.
struct HeadCopy {
  int shift, pieces;
};
__device__ __forceinline__ HeadCopy head_copy(int hk, size_t head, int cw) {
  // cw is a power of two: masks and shifts, not integer divisions.
  const int shift = hk * static_cast<int>(head) & (cw - 1);  // heads of a row: within 2^31
  return {shift, (shift + static_cast<int>(head) + cw - 1) >> (__ffs(cw) - 1)};
}

__device__ __forceinline__ void cp_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
// Waits until at most N of this thread's commit groups of copies are still in flight.
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
// A decode block's span: the keys the query sees (0 past its position) and where the partials
// of its kv head's query heads go; an empty span marks them empty.
__device__ __forceinline__ int decode_span(const Geo& g, float* part, int s, int hk, float*& pout) {
  const Span sp = g.spans[s];
  const int n = min(sp.n, g.pos[0] - sp.start + 1);
  const size_t stride = part_stride(g.d);
  pout = part + (static_cast<size_t>(s) * g.n_head + hk * g.group) * stride;
  if (n <= 0)
    for (int r = threadIdx.x; r < g.group; r += blockDim.x) pout[r * stride + 2] = 0.0f;
  return n;
}

constexpr int kDecThreads = 128;
constexpr int kDecWarps = kDecThreads / 32;
constexpr int kMaxGroup = 8;

// Raw K and V rows of a decode tile in shared memory: rows padded to 16 bytes.
struct DecTile {
  int keys, kst, vst, cw;  // keys per tile, K and V row strides, copy width
};

// Decode, step 1: the partial of one span for the query heads of one kv head:
// part[(span * n_head + head) * part_stride(d) + ...] (kPartO).
// The span is read in tiles of raw K and V rows copied into shared memory one tile ahead
// (cp.async), so a block waits for memory about once, not once per key: a ring chunk's few
// spans finish in a few microseconds. Per tile: scores with d / 8 lanes per key (each lane
// holds its 8 dimensions of every head's query in registers), an online softmax per head,
// then values with each lane owning d / 32 output dimensions and the warps splitting the keys.
// kG: the most query heads per kv head, kE: d / 32 at most.
template <DType K, DType V, int kG, int kE>
__global__ void __launch_bounds__(kDecThreads, 5) decode_partials(Geo g, float* part, DecTile t) {
  pdl_wait();
  extern __shared__ __align__(16) uint8_t raw[];  // [2][t.keys][kst + vst]
  __shared__ float sc[kMaxGroup][64];             // the tile's scores, then probabilities
  __shared__ float st[3][kMaxGroup];              // running max, sum; the tile's rescale
  __shared__ float red[kDecWarps][256];
  const int s = blockIdx.x, hk = blockIdx.y, d = g.d, ng = g.group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const Span sp = g.spans[s];
  const size_t stride = part_stride(d);
  float* pout;
  const int n = decode_span(g, part, s, hk, pout);
  if (n <= 0) return;
  const int tk = t.keys, buf_bytes = tk * (t.kst + t.vst);
  const uint8_t* kg = sp.page + hk * g.k_head;
  const uint8_t* vg = sp.page + g.v_offset + hk * g.v_head;
  const int kw = static_cast<int>(g.k_head) / t.cw, vw = static_cast<int>(g.v_head) / t.cw;
  const auto issue = [&](int k0, uint8_t* dst) {
    const int nk = min(tk, n - k0);
    cp_rows(dst, t.kst, kg + static_cast<size_t>(k0) * g.k_row, g.k_row, nk, kw, t.cw, threadIdx.x,
            kDecThreads);
    cp_rows(dst + tk * t.kst, t.vst, vg + static_cast<size_t>(k0) * g.v_row, g.v_row, nk, vw, t.cw,
            threadIdx.x, kDecThreads);
  };
  issue(0, raw);
  cp_commit();

  const int lk = d / 8, kpw = 32 / lk, e = (lane % lk) * 8;
  float qr[kG][8];
#pragma unroll
  for (int gi = 0; gi < kG; ++gi)
#pragma unroll
    for (int k = 0; k < 8; ++k) qr[gi][k] = gi < ng ? g.q[(hk * ng + gi) * d + e + k] : 0.0f;
  if (threadIdx.x < ng) st[0][threadIdx.x] = -INFINITY, st[1][threadIdx.x] = 0.0f;
  const int epl = d / 32, e0 = lane * epl;
  float o[kG][kE] = {};

  for (int k0 = 0, b = 0; k0 < n; k0 += tk, b ^= 1) {
    if (k0 + tk < n) issue(k0 + tk, raw + (b ^ 1) * buf_bytes);
    cp_commit();
    cp_wait<1>();
    __syncthreads();
    const uint8_t* rk = raw + b * buf_bytes;
    const uint8_t* rv = rk + tk * t.kst;
    const int nk = min(tk, n - k0);
    // Scores of the tile (-inf past its keys).
    for (int j0 = warp * kpw; j0 < tk; j0 += kDecWarps * kpw) {
      const int j = j0 + lane / lk;
      float kv[8] = {};
      if (j < nk) kv_oct<K>(rk + j * t.kst, d / 32, e, kv);
#pragma unroll
      for (int gi = 0; gi < kG; ++gi) {
        if (gi >= ng) break;
        float a = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; ++k) a = fmaf(qr[gi][k], kv[k], a);
        for (int off = lk / 2; off > 0; off >>= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
        if (e == 0) sc[gi][j] = j < nk ? a * g.scale : -INFINITY;
      }
    }
    __syncthreads();
    // Online softmax per head, a warp per head: the new max, the tile's probabilities and the
    // factor that rescales what came before.
    for (int gi = warp; gi < ng; gi += kDecWarps) {
      float m = -INFINITY;
      for (int j = lane; j < tk; j += 32) m = fmaxf(m, sc[gi][j]);
      m = fmaxf(warp_max(m), st[0][gi]);
      float l = 0.0f;
      for (int j = lane; j < tk; j += 32) {
        const float p = expf(sc[gi][j] - m);
        sc[gi][j] = p;
        l += p;
      }
      l = warp_sum(l);
      if (lane == 0) {
        const float r = expf(st[0][gi] - m);
        st[2][gi] = r;
        st[1][gi] = st[1][gi] * r + l;
        st[0][gi] = m;
      }
    }
    __syncthreads();
#pragma unroll
    for (int gi = 0; gi < kG; ++gi) {
      if (gi >= ng) break;
      const float r = st[2][gi];
#pragma unroll
      for (int k = 0; k < kE; ++k) o[gi][k] *= r;
    }
#pragma unroll 4
    for (int j = warp; j < nk; j += kDecWarps) {
      float v[kE];
      kv_elems<V, kE>(rv + j * t.vst, d / 32, e0, epl, v);
#pragma unroll
      for (int gi = 0; gi < kG; ++gi) {
        if (gi >= ng) break;
        const float p = sc[gi][j];
#pragma unroll
        for (int k = 0; k < kE; ++k)
          if (k < epl) o[gi][k] = fmaf(p, v[k], o[gi][k]);
      }
    }
    __syncthreads();  // the buffer and the scores are rewritten by the next tile
  }
  // The warps' outputs summed in warp order, one head at a time.
#pragma unroll
  for (int gi = 0; gi < kG; ++gi) {
    if (gi >= ng) break;
#pragma unroll
    for (int k = 0; k < kE; ++k)
      if (k < epl) red[warp][e0 + k] = o[gi][k];
    __syncthreads();
    for (int i = threadIdx.x; i < d; i += kDecThreads) {
      float a = 0.0f;
      for (int w = 0; w < kDecWarps; ++w) a += red[w][i];
      pout[gi * stride + kPartO + i] = a;
    }
    __syncthreads();
  }
  for (int gi = threadIdx.x; gi < ng; gi += blockDim.x) {
    pout[gi * stride] = st[0][gi];
    pout[gi * stride + 1] = st[1][gi];
    pout[gi * stride + 2] = 1.0f;
  }
}

// One span in the fold: the state times ea plus the span times eb (ea 1, eb 0 for an empty
// span, whose partial is not even read; ea 0, eb 1 for the first span taken). `before` and
// `after` are the running max before and after the span.
struct FoldStep {
  float ea, eb;
};
__device__ __forceinline__ FoldStep fold_step(bool live, bool first, float before, float after,
                                              float pm) {
  return {!live   ? 1.0f
          : first ? 0.0f
                  : expf(before - after),
          !live   ? 0.0f
          : first ? 1.0f
                  : expf(pm - after)};
}
__device__ __forceinline__ float fold_out(float o, FoldStep f, float cur) {
  return fmaf(o, f.ea, f.eb != 0.0f ? cur * f.eb : 0.0f);
}
// The end of a decode fold: the output (normalised after the last call, and quantized for the
// next product) and the state.
__device__ __forceinline__ void fold_write(const Geo& g, int h, int i, float m, float l, float o) {
  const float v = g.last ? o / l : o;
  g.out[h * g.d + i] = v;
  if (i == 0) g.acc[2 * h] = m, g.acc[2 * h + 1] = l;
  if (g.xq) {  // called by whole warps, a warp's lanes on 32 dimensions of one head
    const size_t b = static_cast<size_t>(h * g.d + i) / 32,
                 nb = static_cast<size_t>(g.n_head * g.d) / 32;
    quantize_x_block(v, i % 32, reinterpret_cast<XBlock*>(g.xq) + b,
                     reinterpret_cast<XMeta*>(g.xq + nb * sizeof(XBlock)) + b);
  }
}

// Decode, step 2: fold the partials of every span into the running state, in span order. A
// warp per (head, 32 output dimensions), a lane per dimension. The state's max only grows, so
// the max after each span is a prefix max, and the factors that rescale the state and the
// span's partial depend on maxima alone: the warp computes them for a chunk of kChunk spans at
// once (a scan over its lanes, kChunk / 32 spans a lane, the same expf of the same differences
// as a one-by-one fold, so the chunk's size does not change the result), and the only serial
// work left is the sum and the output, one multiply-add per span. A span is merged (o * ea +
// cur * eb), taken as the first (nothing before it) or skipped (empty). The fold reads every
// partial once (megabytes a layer at long contexts) and does little with it, so its speed is
// the bytes in flight: the chunks come by cp.async into a ring of kStages. It runs as a kernel
// of its own (decode_fold) or inside the attention's launch, behind its spans (decode_tc).
__device__ __forceinline__ void cp_async_cg16(void* dst, const void* src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
}
// Shared memory of one fold warp: outputs [kStages][kChunk][32] floats, span heads
// [kStages][kChunk] and the chunk's factors [kChunk], float4 each.
__host__ __device__ constexpr int fold_bytes(int chunk, int stages) {
  return stages * chunk * (32 * 4 + 16) + chunk * 16;
}
// The fold of head h, dimensions [32 db, 32 db + 32), by one warp; ready(c) returns once the
// partials of chunk c are written (the attention's launch) or at once (a launch of its own).
template <int kChunk, int kStages, class Ready>
__device__ __forceinline__ void fold_run(const Geo& g, const float* part, int h, int db,
                                         uint8_t* smem, Ready ready) {
  constexpr int kPer = kChunk / 32;
  auto so = reinterpret_cast<float(*)[kChunk][32]>(smem);  // the chunk's outputs
  auto sm = reinterpret_cast<float4(*)[kChunk]>(smem + kStages * kChunk * 32 * 4);
  float4* sf = reinterpret_cast<float4*>(smem + kStages * kChunk * (32 * 4 + 16));
  const int lane = threadIdx.x % 32, i = db * 32 + lane, n = g.n_spans;
  const size_t stride = part_stride(g.d), step = stride * g.n_head;
  float m = g.first ? 0.0f : g.acc[2 * h], l = g.first ? 0.0f : g.acc[2 * h + 1];
  float o = l != 0.0f ? g.out[h * g.d + i] : 0.0f;
  // Before the chunk: the running max (-inf while nothing was taken) and whether any is.
  float run_max = l != 0.0f ? m : -INFINITY;
  bool any = l != 0.0f;
  const float* base = part + h * stride;
  const int n_chunks = (n + kChunk - 1) / kChunk;
  // Chunk c into stage c % kStages, one commit group each (empty past the end): the heads of
  // the lane's spans, and 16-byte pieces of the outputs, 8 a span.
  const auto issue = [&](int c) {
    if (c < n_chunks) {
      ready(c);
      const int s0 = c * kChunk, st = c % kStages;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int s = kPer * lane + j;
        if (s0 + s < n) cp_async_cg16(&sm[st][s], base + (s0 + s) * step);
      }
      const float* src = base + kPartO + db * 32 + 4 * (lane % 8);
#pragma unroll
      for (int j = 0; j < kChunk / 4; ++j) {
        const int s = lane / 8 + 4 * j;
        if (s0 + s < n) cp_async_cg16(&so[st][s][4 * (lane % 8)], src + (s0 + s) * step);
      }
    }
    cp_commit();
  };
#pragma unroll
  for (int c = 0; c < kStages; ++c) issue(c);
  for (int c = 0; c < n_chunks; ++c) {
    cp_wait<kStages - 1>();  // chunk c has landed
    __syncwarp();
    const int s0 = c * kChunk, st = c % kStages;
    // The lane's spans kPer lane + j: their maxima and sums, and the running max and count of
    // the live ones within the lane's run.
    float pm[kPer], pl[kPer], run[kPer];
    bool live[kPer];
    int cnt[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int s = kPer * lane + j;
      const bool in = s0 + s < n;
      const float4 head = in ? sm[st][s] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      pm[j] = head.x, pl[j] = head.y;
      live[j] = in && head.z != 0.0f;  // an empty span's other values are garbage
      const float r = j ? run[j - 1] : -INFINITY;
      run[j] = live[j] ? fmaxf(r, pm[j]) : r;
      cnt[j] = (j ? cnt[j - 1] : 0) + (live[j] ? 1 : 0);
    }
    // Over the lanes: the max and count of the runs up to the lane's (inclusive), then those
    // before it joined with the state's max.
    float after = run[kPer - 1];
    int taken = cnt[kPer - 1];
#pragma unroll
    for (int k = 1; k < 32; k *= 2) {
      const float x = __shfl_up_sync(0xffffffffu, after, k);
      const int y = __shfl_up_sync(0xffffffffu, taken, k);
      if (lane >= k) after = fmaxf(after, x), taken += y;
    }
    float before = __shfl_up_sync(0xffffffffu, after, 1);
    int prior = __shfl_up_sync(0xffffffffu, taken, 1);
    if (lane == 0) before = -INFINITY, prior = 0;
    before = fmaxf(before, run_max);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {  // span kPer lane + j: the max before and after it
      const float b = j ? fmaxf(before, run[j - 1]) : before, a = fmaxf(before, run[j]);
      const int p = prior + (j ? cnt[j - 1] : 0);
      const FoldStep f = fold_step(live[j], !any && p == 0, b, a, pm[j]);
      sf[kPer * lane + j] = make_float4(f.ea, f.eb, live[j] ? pl[j] * f.eb : 0.0f, 0.0f);
    }
    run_max = fmaxf(run_max, __shfl_sync(0xffffffffu, after, 31));
    any = any || __shfl_sync(0xffffffffu, taken, 31) > 0;
    __syncwarp();
    // The serial part: one multiply-add per span for the sum and for the output, the span's
    // factors one broadcast load (a skipped span's output, never copied, is not read: its eb
    // is 0).
#pragma unroll
    for (int s = 0; s < kChunk; ++s) {
      const float4 x = sf[s];
      l = fmaf(l, x.x, x.z);
      o = fold_out(o, FoldStep{x.x, x.y}, so[st][s][lane]);
    }
    __syncwarp();  // the stage is refilled now
    issue(c + kStages);
  }
  fold_write(g, h, i, any ? run_max : m, l, o);
}
constexpr int kFoldChunk = 64, kFoldStages = 4;
__global__ void __launch_bounds__(32) decode_fold(Geo g, const float* part) {
  __shared__ __align__(16) uint8_t smem[fold_bytes(kFoldChunk, kFoldStages)];
  pdl_wait();
  fold_run<kFoldChunk, kFoldStages>(g, part, blockIdx.x, blockIdx.y, smem, [](int) {});
}

// The fold's grid: a warp per head and 32 dimensions.
dim3 fold_grid(const Geo& g) {
  return dim3(static_cast<unsigned>(g.n_head), static_cast<unsigned>(g.d / 32));
}

// Prefill tiles: kTQ queries x the group's heads as rows, kTK keys per tile.
constexpr int kPreThreads = 128;
constexpr int kTK = 32;

template <int D>
struct Tile {
  // Query rows (query, head) per block. Heads of 256 take 16: their tile's 91 KiB of shared
  // memory fit the 99 KiB a block may have on the consumer cards (sm_86, sm_89, sm_120), which
  // 32 rows (110 KiB) did not (the null GPU of bench/null_cuda.cpp refused the launch).
  static constexpr int kRows = D == 256 ? 16 : 64;
  static constexpr int kRI = kRows / 16;  // consecutive rows per thread
  static constexpr int kDJ = D / 8;       // consecutive output dimensions per thread
  // Q and P are stored transposed, so a thread reads its rows (and K its keys) as one vector.
  static constexpr int kQS = kRows + 4, kKS = kTK + 4, kVS = D + 4, kPS = kRows + 4;
  static constexpr size_t kSmem =
      sizeof(float) * (D * kQS + D * kKS + kTK * kVS + kTK * kPS + 4 * kRows);
  static_assert(kSmem <= 99 * 1024, "a block's shared memory on sm_86, sm_89 and sm_120");
};

// kN consecutive floats of shared memory (16- or 8-byte aligned) into registers.
template <int kN>
__device__ __forceinline__ void lds(const float* p, float* v) {
  if constexpr (kN == 1) {
    v[0] = *p;
  } else if constexpr (kN == 4) {
    const float4 f = *reinterpret_cast<const float4*>(p);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  } else {
#pragma unroll
    for (int k = 0; k < kN; k += 2) {
      const float2 f = *reinterpret_cast<const float2*>(p + k);
      v[k] = f.x, v[k + 1] = f.y;
    }
  }
}

template <DType K, DType V, int D>
__global__ void __launch_bounds__(kPreThreads) prefill(Geo g) {
  pdl_wait();
  using T = Tile<D>;
  extern __shared__ float smem[];
  float* qt = smem;               // [D][kQS]: Q transposed
  float* kt = qt + D * T::kQS;    // [D][kKS]: K transposed
  float* vs = kt + D * T::kKS;    // [kTK][kVS]
  float* pt = vs + kTK * T::kVS;  // [kTK][kPS]: scores, then probabilities, transposed
  float* rm = pt + kTK * T::kPS;  // running max per row
  float* rl = rm + T::kRows;      // running sum
  float* ra = rl + T::kRows;      // this tile's rescale factor
  int* rp = reinterpret_cast<int*>(ra + T::kRows);  // query position (-1: no row)
  const int ng = g.group, hk = blockIdx.y;
  const int tq = T::kRows / ng;  // queries per block
  const int t0 = blockIdx.x * tq;
  const int tid = threadIdx.x, tx = tid % 8, ty = tid / 8;
  const int row0 = T::kRI * ty, key0 = 4 * tx, dim0 = T::kDJ * tx;

  // Rows r = (query t0 + r / ng, head hk * ng + r % ng).
  for (int i = tid; i < T::kRows * D; i += kPreThreads) {
    const int r = i / D, e = i % D, t = t0 + r / ng;
    const int h = hk * ng + r % ng;
    qt[e * T::kQS + r] =
        (r < tq * ng && t < g.n_tok) ? g.q[(static_cast<size_t>(t) * g.n_head + h) * D + e] : 0.0f;
  }
  int max_pos = -1;
  for (int r = tid; r < T::kRows; r += kPreThreads) {
    const int t = t0 + r / ng;
    const bool ok = r < tq * ng && t < g.n_tok;
    rp[r] = ok ? g.pos[t] : -1;
    const size_t a = 2 * (static_cast<size_t>(t) * g.n_head + hk * ng + r % ng);
    rm[r] = ok && !g.first ? g.acc[a] : -INFINITY;
    rl[r] = ok && !g.first ? g.acc[a + 1] : 0.0f;
  }
  for (int t = t0; t < min(t0 + tq, g.n_tok); ++t) max_pos = max(max_pos, g.pos[t]);
  float o[T::kRI][T::kDJ];
  __syncthreads();
#pragma unroll
  for (int i = 0; i < T::kRI; ++i) {
    const int r = row0 + i, t = t0 + r / ng;
    const bool has = rp[r] >= 0 && rl[r] != 0.0f;
    const float* src =
        has ? g.out + (static_cast<size_t>(t) * g.n_head + hk * ng + r % ng) * D : nullptr;
#pragma unroll
    for (int j = 0; j < T::kDJ; ++j) o[i][j] = has ? src[dim0 + j] : 0.0f;
  }

  for (int s = 0; s < g.n_spans; ++s) {
    const Span sp = g.spans[s];
    if (sp.start > max_pos) break;
    const int n_span = min(sp.n, max_pos - sp.start + 1);
    for (int k0 = 0; k0 < n_span; k0 += kTK) {
      const int nk = min(kTK, n_span - k0);
      // Dequantize the tile: a thread per (key, 32-element sub-block).
      for (int i = tid; i < kTK * (D / 32); i += kPreThreads) {
        const int j = i / (D / 32), sb = i % (D / 32);
        float kv[32];
        if (j < nk) {
          const size_t key = static_cast<size_t>(k0 + j);
          kv_sub<K>(sp.page + key * g.k_row + hk * g.k_head, D / 32, sb, kv);
#pragma unroll
          for (int e = 0; e < 32; ++e) kt[(sb * 32 + e) * T::kKS + j] = kv[e];
          kv_sub<V>(sp.page + g.v_offset + key * g.v_row + hk * g.v_head, D / 32, sb, kv);
#pragma unroll
          for (int e = 0; e < 32; ++e) vs[j * T::kVS + sb * 32 + e] = kv[e];
        } else {
#pragma unroll
          for (int e = 0; e < 32; ++e)
            kt[(sb * 32 + e) * T::kKS + j] = 0.0f, vs[j * T::kVS + sb * 32 + e] = 0.0f;
        }
      }
      __syncthreads();
      // Scores of rows row0.., keys key0..key0 + 3.
      float a[T::kRI][4] = {};
#pragma unroll 4
      for (int e = 0; e < D; ++e) {
        float qv[T::kRI], kv[4];
        lds<T::kRI>(qt + e * T::kQS + row0, qv);
        lds<4>(kt + e * T::kKS + key0, kv);
#pragma unroll
        for (int i = 0; i < T::kRI; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) a[i][j] = fmaf(qv[i], kv[j], a[i][j]);
      }
#pragma unroll
      for (int i = 0; i < T::kRI; ++i) {
        const int r = row0 + i;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int key = key0 + j;
          const bool live = key < nk && sp.start + k0 + key <= rp[r];
          pt[key * T::kPS + r] = live ? a[i][j] * g.scale : -INFINITY;
        }
      }
      __syncthreads();
      // Online softmax: two threads per row (64 rows), or eight (16 rows).
      {
        constexpr int kPer = kPreThreads / T::kRows;
        const int r = tid / kPer, part = tid % kPer;
        float m = -INFINITY;
        for (int j = part; j < kTK; j += kPer) m = fmaxf(m, pt[j * T::kPS + r]);
        for (int w = kPer / 2; w > 0; w >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, w));
        const float mo = rm[r], mn = fmaxf(mo, m);
        float l = 0.0f;
        for (int j = part; j < kTK; j += kPer) {
          const float p = mn == -INFINITY ? 0.0f : expf(pt[j * T::kPS + r] - mn);
          pt[j * T::kPS + r] = p;
          l += p;
        }
        for (int w = kPer / 2; w > 0; w >>= 1) l += __shfl_xor_sync(0xffffffffu, l, w);
        if (part == 0) {
          const float al = mo == -INFINITY ? 0.0f : expf(mo - mn);
          ra[r] = mn == -INFINITY ? 1.0f : al;
          rl[r] = rl[r] * ra[r] + l;
          rm[r] = mn;
        }
      }
      __syncthreads();
      // Values.
#pragma unroll
      for (int i = 0; i < T::kRI; ++i) {
        const float al = ra[row0 + i];
#pragma unroll
        for (int j = 0; j < T::kDJ; ++j) o[i][j] *= al;
      }
#pragma unroll 2
      for (int key = 0; key < kTK; ++key) {
        float p[T::kRI];
        lds<T::kRI>(pt + key * T::kPS + row0, p);
#pragma unroll
        for (int j = 0; j < T::kDJ; j += 4) {
          float v[4];
          lds<4>(vs + key * T::kVS + dim0 + j, v);
#pragma unroll
          for (int i = 0; i < T::kRI; ++i)
#pragma unroll
            for (int k = 0; k < 4; ++k) o[i][j + k] = fmaf(p[i], v[k], o[i][j + k]);
        }
      }
      __syncthreads();
    }
  }
#pragma unroll
  for (int i = 0; i < T::kRI; ++i) {
    const int r = row0 + i;
    if (rp[r] < 0) continue;
    const int t = t0 + r / ng;
    const size_t hrow = static_cast<size_t>(t) * g.n_head + hk * ng + r % ng;
    const float l = rl[r];
#pragma unroll
    for (int j = 0; j < T::kDJ; ++j) g.out[hrow * D + dim0 + j] = g.last ? o[i][j] / l : o[i][j];
    if (tx == 0) g.acc[2 * hrow] = rm[r], g.acc[2 * hrow + 1] = l;
  }
}

// Prefill on tensor cores, for head sizes 64 and 128, on f16 K and V (a quantized cache is
// converted first, kv_to_f16: once per call, not once per block that reads it): a block of 8
// warps takes 128 rows (query, head), 16 per warp. Tiles of 64 keys (never crossing a span) are
// copied into shared memory one tile ahead (cp.async) and multiplied with mma.sync m16n8k16
// (f16 inputs, f32 accumulators): S = Q K^T, the online softmax on the accumulators in
// registers, O += P V with P re-read as the A operand. Q and P are rounded to f16, the CPU keeps
// f32: the tolerance of the tests says how far that goes.
constexpr int kTcRows = 128, kTcKeys = 64, kTcThreads = 256;

__device__ __forceinline__ void ldsm4(uint32_t* r, const __half* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldsm4t(uint32_t* r, const __half* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void mma16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t h2u(float x, float y) {
  const __half2 h = __floats2half2_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// One ex2 instruction (flushing results below 2^-126 to zero) where expf takes several.
constexpr float kLog2e = 1.4426950408889634f;
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The online softmax of one prefill tile on mma accumulators: sc[nt][e] is the (masked,
// scaled) score of row gr + 8 (e / 2) and key 8 nt + 2 t4 + e % 2, each row spread over the 4
// threads of a quad. Scores become probabilities against the new running max m; l is updated
// and o, the unnormalised output of the rows ([D / 8][4], the same row split), is rescaled.
// Scores and maxima are in units of log2 (the scale times log2(e) was folded into Q), so each
// probability is one ex2; it made the prefill at 32K 1.17x faster than expf.
template <int kN, int kO, int kC>
__device__ __forceinline__ void tile_softmax(float (&sc)[kN][4], float (&m)[2], float (&l)[2],
                                             float (&o)[kO][kC]) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < kN; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) mx[e / 2] = fmaxf(mx[e / 2], sc[nt][e]);
  float al[2], ls[2] = {0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
    mx[i] = fmaxf(m[i], mx[i]);  // the new running max
  }
  // A row whose max is -inf has only -inf scores: against 0 they give 0, not NaN.
  const float mu[2] = {mx[0] == -INFINITY ? 0.0f : mx[0], mx[1] == -INFINITY ? 0.0f : mx[1]};
#pragma unroll
  for (int nt = 0; nt < kN; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = e / 2;
      const float x = sc[nt][e] - mu[i];
      const float p = ex2(x);
      sc[nt][e] = p;
      ls[i] += p;
    }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    ls[i] += __shfl_xor_sync(0xffffffffu, ls[i], 1);
    ls[i] += __shfl_xor_sync(0xffffffffu, ls[i], 2);
    const float a = m[i] == -INFINITY ? 0.0f : ex2(m[i] - mx[i]);
    al[i] = mx[i] == -INFINITY ? 1.0f : a;
    l[i] = l[i] * al[i] + ls[i];
    m[i] = mx[i];
  }
  if (__any_sync(0xffffffffu, al[0] != 1.0f || al[1] != 1.0f))  // most tiles keep the max
#pragma unroll
    for (int nt = 0; nt < kO; ++nt)
#pragma unroll
      for (int e = 0; e < kC; ++e) o[nt][e] *= al[e / 2];
}

template <int D>
__global__ void __launch_bounds__(kTcThreads) prefill_tc(Geo g) {
  pdl_wait();
  constexpr int kHS = D + 8;  // halves per row of the f16 tiles (rows 16-byte aligned)
  constexpr int kTile = kTcKeys * kHS;
  extern __shared__ __align__(16) uint8_t tc_smem[];
  __half* kh = reinterpret_cast<__half*>(tc_smem);  // [2][kTcKeys][kHS]
  __half* vh = kh + 2 * kTile;                      // [2][kTcKeys][kHS]
  const int ng = g.group, hk = blockIdx.y, tq = kTcRows / ng, t0 = blockIdx.x * tq;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gr = lane / 4, t4 = lane % 4;

  // This thread's rows of the warp's 16: gr and gr + 8.
  bool ok[2];
  int rpos[2];
  size_t hrow[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = 16 * warp + gr + 8 * i, t = t0 + r / ng;
    ok[i] = r < tq * ng && t < g.n_tok;
    rpos[i] = ok[i] ? g.pos[t] : -1;
    hrow[i] = static_cast<size_t>(ok[i] ? t : 0) * g.n_head + hk * ng + r % ng;
  }
  int max_pos = -1;
  for (int t = t0; t < min(t0 + tq, g.n_tok); ++t) max_pos = max(max_pos, g.pos[t]);

  // Q times the scale and log2(e): scores in units of log2 (so are the maxima in g.acc, which
  // only this kernel reads).
  const float qs = g.scale * 1.44269504088896341f;
  uint32_t qa[D / 16][4];
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = e % 2, dim = 16 * ks + 8 * (e / 2) + 2 * t4;
      const float2 f = ok[i] ? *reinterpret_cast<const float2*>(g.q + hrow[i] * D + dim)
                             : make_float2(0.0f, 0.0f);
      qa[ks][e] = h2u(f.x * qs, f.y * qs);  // scaled once here, not every score
    }
  float m[2], l[2], o[D / 8][4];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    m[i] = ok[i] && !g.first ? g.acc[2 * hrow[i]] : -INFINITY;
    l[i] = ok[i] && !g.first ? g.acc[2 * hrow[i] + 1] : 0.0f;
    const bool has = ok[i] && l[i] != 0.0f;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      const float2 f = has ? *reinterpret_cast<const float2*>(g.out + hrow[i] * D + 8 * nt + 2 * t4)
                           : make_float2(0.0f, 0.0f);
      o[nt][2 * i] = f.x, o[nt][2 * i + 1] = f.y;
    }
  }

  // The span a tile lies in, with the keys this block looks at (0 past its last query's
  // position). Spans are read once each, the next one ahead of its first tile.
  struct SpanAt {
    const uint8_t* page;
    int start, len;
  };
  const auto span_at = [&](int s) {
    if (s >= g.n_spans) return SpanAt{nullptr, 0, 0};
    const Span sp = g.spans[s];
    return SpanAt{sp.page, sp.start, sp.start > max_pos ? 0 : min(sp.n, max_pos - sp.start + 1)};
  };
  // A tile's copies: thread tid takes row tid / 4 of K and of V, every fourth 16-byte piece.
  // Rows past a partial tile's keys are zeros in V (their P is 0, but 0 times a stale NaN is
  // not); K's are masked.
  const int cr = tid / 4, cc = tid % 4;
  const auto issue = [&](SpanAt sp, int k0, int b) {
    constexpr int kPer = D / 32;  // pieces of a row per thread
    uint8_t* kd = reinterpret_cast<uint8_t*>(kh + b * kTile + cr * kHS) + 16 * cc;
    uint8_t* vd = reinterpret_cast<uint8_t*>(vh + b * kTile + cr * kHS) + 16 * cc;
    if (cr < sp.len - k0) {
      const size_t k = static_cast<size_t>(k0 + cr);
      const uint8_t* ks = sp.page + k * g.k_row + hk * g.k_head + 16 * cc;
      const uint8_t* vs = sp.page + g.v_offset + k * g.v_row + hk * g.v_head + 16 * cc;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        cp_async(kd + 64 * j, ks + 64 * j, 16);
        cp_async(vd + 64 * j, vs + 64 * j, 16);
      }
    } else {
#pragma unroll
      for (int j = 0; j < kPer; ++j)
        *reinterpret_cast<uint4*>(vd + 64 * j) = make_uint4(0, 0, 0, 0);
    }
  };

  int s_cur = 0, k_cur = 0;               // the tile
  SpanAt a = span_at(0), b = span_at(1);  // its span and the next
  bool have = a.len > 0;
  int buf = 0;
  if (have) issue(a, 0, 0);
  cp_commit();
  while (have) {
    // The next tile: further into this span, or the next span's first.
    const bool cross = k_cur + kTcKeys >= a.len;
    const int k_nxt = cross ? 0 : k_cur + kTcKeys;
    const bool more = !cross || b.len > 0;
    if (more) issue(cross ? b : a, k_nxt, buf ^ 1);  // the other tiles were read last iteration
    cp_commit();
    cp_wait<1>();
    __syncthreads();
    const int nk = min(kTcKeys, a.len - k_cur);
    const int key_pos = a.start + k_cur;
    const __half* kt = kh + buf * kTile;
    const __half* vt = vh + buf * kTile;
    // S = Q K^T: 8 tiles of 8 keys.
    float sc[kTcKeys / 8][4] = {};
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks)
#pragma unroll
      for (int np = 0; np < kTcKeys / 16; ++np) {
        uint32_t b[4];
        const int mi = lane / 8;
        ldsm4(b, kt + (16 * np + 8 * (mi / 2) + lane % 8) * kHS + 16 * ks + 8 * (mi % 2));
        mma16816(sc[2 * np], qa[ks], b[0], b[1]);
        mma16816(sc[2 * np + 1], qa[ks], b[2], b[3]);
      }
    // Masks where the tile is not whole or reaches past a row's position (most tiles are not).
    if (nk < kTcKeys || key_pos + kTcKeys - 1 > min(rpos[0], rpos[1]))
#pragma unroll
      for (int nt = 0; nt < kTcKeys / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = e / 2, key = 8 * nt + 2 * t4 + e % 2;
          if (key >= nk || key_pos + key > rpos[i]) sc[nt][e] = -INFINITY;
        }
    tile_softmax(sc, m, l, o);
    // O += P V.
#pragma unroll
    for (int kk = 0; kk < kTcKeys / 16; ++kk) {
      const uint32_t pa[4] = {h2u(sc[2 * kk][0], sc[2 * kk][1]), h2u(sc[2 * kk][2], sc[2 * kk][3]),
                              h2u(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                              h2u(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
      for (int j = 0; j < D / 16; ++j) {
        uint32_t b[4];
        const int mi = lane / 8;
        ldsm4t(b, vt + (16 * kk + 8 * (mi % 2) + lane % 8) * kHS + 16 * j + 8 * (mi / 2));
        mma16816(o[2 * j], pa, b[0], b[1]);
        mma16816(o[2 * j + 1], pa, b[2], b[3]);
      }
    }
    __syncthreads();  // the tiles are read: the next iteration copies into them
    if (cross) a = b, b = span_at(++s_cur + 1);
    k_cur = k_nxt;
    have = more;
    buf ^= 1;
  }
  asm volatile("cp.async.wait_all;\n" ::);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (!ok[i]) continue;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      float2 f = make_float2(o[nt][2 * i], o[nt][2 * i + 1]);
      if (g.last) f.x /= l[i], f.y /= l[i];
      *reinterpret_cast<float2*>(g.out + hrow[i] * D + 8 * nt + 2 * t4) = f;
    }
    if (t4 == 0) g.acc[2 * hrow[i]] = m[i], g.acc[2 * hrow[i] + 1] = l[i];
  }
}

// K and V rows of spans [s0, s0 + gridDim.x) of a quantized cache, every kv head, as f16 in
// pages of the f16 layout (kv16: page s holds page_keys K rows of n_kv * D halves, then as many
// V rows); spans16[s] is span s0 + s on its page. Eight elements a thread.
template <DType K, DType V, int D>
__global__ void kv_to_f16(Geo g, int s0, int page_keys, int n_kv, __half* __restrict__ kv16,
                          Span* __restrict__ spans16) {
  pdl_wait();
  const Span sp = g.spans[s0 + blockIdx.x];
  __half* page = kv16 + static_cast<size_t>(blockIdx.x) * 2 * page_keys * n_kv * D;
  if (blockIdx.y == 0 && threadIdx.x == 0)
    spans16[blockIdx.x] = Span{reinterpret_cast<const uint8_t*>(page), sp.start, sp.n};
  constexpr int kOct = D / 8;
  const int per_key = n_kv * kOct;  // octets of one key's K (or V) row
  const int n = 2 * sp.n * per_key;
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < n; i += gridDim.y * blockDim.x) {
    const bool is_v = i >= sp.n * per_key;
    const int ii = is_v ? i - sp.n * per_key : i, j = ii / per_key, h = ii % per_key / kOct;
    const int e = 8 * (ii % kOct);
    const uint4 v = is_v ? dequant8<V>(sp.page + g.v_offset + j * g.v_row + h * g.v_head, D / 32, e)
                         : dequant8<K>(sp.page + j * g.k_row + h * g.k_head, D / 32, e);
    __half* row = page + (is_v ? static_cast<size_t>(page_keys) * n_kv * D : 0) +
                  (static_cast<size_t>(j) * n_kv + h) * D;
    *reinterpret_cast<uint4*>(row + e) = v;
  }
}

// Decode on tensor cores, for head sizes 64 and 128 and up to 8 query heads per kv head: one
// warp per (span, kv head), 4 to a block, the kv heads of a span next to each other so that the
// warps running together read whole K and V rows. A warp walks its span in tiles of 16 keys,
// up to kStages tiles in flight, and writes (or folds) the span's partial itself: no merge
// with other warps, no block barrier (a span split between 4 warps spent a third of its time
// starting and merging at a page of 256 keys). Per tile: raw rows copied (cp.async) into the
// warp's part of shared memory, then two mma.sync m16n8k16 products per tile with the
// tile's 16 keys or 16 dimensions as the rows and the group's heads as the 8 columns, so every
// accumulator is used: S^T = K Q^T, an online softmax per head, O^T += V^T P'^T, where P^T is
// S^T's accumulators transposed in registers (movmatrix). Quantized levels enter the products
// as the exact halves 1024 + level (the 0x6400 trick: two instructions per pair, no
// conversion, no scale): a K block's scale and offset are applied to its 32-dimension dot
// products (S = d (c - off sum q)), a V block's scale goes into P (P' = P d, per block) and its
// offset leaves O at the end (O = O' - off sum P', the sums from one more product against
// ones). Dimensions are permuted inside each product so that a lane's operands are whole
// 4-byte words of a row; the output columns follow the same map.
constexpr int kDtKeys = 16, kDtWarps = 4;

// Bytes of one head's K or V row.
template <DType T, int D>
constexpr int head_bytes() {
  return T == DType::F16 ? 2 * D : T == DType::Q8_0 ? 34 * D / 32 : 18 * D / 32;
}
// Blocks an SM holds (the registers are bounded for it): 3. At 4 (128 registers) q4_0 V with a
// warp per span spilled once a row's quants and scales were read as whole words (q8_0 K: 100
// bytes; 159 tok/s at 128K against 191 at 3 on the H200), and so did the other kinds earlier.
// Tiles in flight per warp: as many (2 to 4) as let those blocks' stages stay within 174 KiB of
// an SM's shared memory with the usual row strides (a head padded to 16 bytes after a shift of
// 8). The rest is L1, which the .ca copies go through: on the H200, q8_0 K/V decoded 15-20 %
// slower with 216 KiB of stages (3 blocks of 4 stages or 4 of 3) than with 162 KiB (3 of 3).
constexpr int kDtBlocks = 3;
template <DType K, DType V, int D>
constexpr int dt_stages() {
  constexpr int pad_k = (head_bytes<K, D>() + 8 + 15) / 16 * 16;
  constexpr int pad_v = (head_bytes<V, D>() + 8 + 15) / 16 * 16;
  constexpr int stage = kDtWarps * kDtKeys * (pad_k + pad_v);
  constexpr int fit = 174 * 1024 / kDtBlocks / stage;
  return fit >= 4 ? 4 : fit >= 2 ? fit : 2;
}

// Pieces c0, c0 + 2, ... (< n) of 16 bytes of one row (dst and src at piece c0), unrolled to at
// most kMax: the addresses are the row's plus constants.
template <int kMax>
__device__ __forceinline__ void cp_row16(unsigned dst, const uint8_t* src, int n, int c0) {
#pragma unroll
  for (int c = 0; c < kMax; c += 2)
    if (c + c0 < n)
      asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(dst + 16 * c),
                   "l"(src + 16 * c));
}

// Four bytes at row + C + v of a 4-byte-aligned row (C, v multiples of 4: a quantized head's
// quants start aligned, page.h).
template <int C>
__device__ __forceinline__ uint32_t ld4(const uint8_t* row, int v) {
  static_assert(C % 4 == 0, "4-byte aligned quants");
  return *reinterpret_cast<const uint32_t*>(row + C + v);
}
// The kB f16 block scales at the start of a quantized head's slice, in one load: the slice
// starts (D / 16)-byte aligned in shared memory, its size being a multiple of that.
template <int kB>
struct Scales {
  __half h[kB];
};
template <int kB>
__device__ __forceinline__ Scales<kB> ld_scales(const uint8_t* head) {
  static_assert(kB == 2 || kB == 4, "head sizes 64 and 128");
  Scales<kB> r;
  if constexpr (kB == 4)
    *reinterpret_cast<uint2*>(r.h) = *reinterpret_cast<const uint2*>(head);
  else
    *reinterpret_cast<uint32_t*>(r.h) = *reinterpret_cast<const uint32_t*>(head);
  return r;
}

// The A operand of S^T = K Q^T for one key's row and block of 32 dimensions: a[s][0] holds
// dimensions 16 s + 4 t4 + {0, 1} of the block, a[s][1] + {2, 3}; f16 as stored, q8_0 levels
// as 1152 + level, q4_0 levels as 1032 + level (kOff below), unscaled. A quantized row's
// quants follow its D / 32 scales (page.h).
template <DType T, int D, int kBlk>
__device__ __forceinline__ void k_block(const uint8_t* row, int t4, uint32_t (&a)[2][2]) {
  constexpr uint32_t k64 = 0x64646464u;
  constexpr int kQ = D / 16;  // the scales' bytes
  if constexpr (T == DType::F16) {
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const uint2 w = *reinterpret_cast<const uint2*>(row + 64 * kBlk + 32 * s + 8 * t4);
      a[s][0] = w.x, a[s][1] = w.y;
    }
  } else if constexpr (T == DType::Q8_0) {
    const uint32_t w0 = ld4<kQ + 32 * kBlk>(row, 4 * t4) ^ 0x80808080u;
    const uint32_t w1 = ld4<kQ + 32 * kBlk + 16>(row, 4 * t4) ^ 0x80808080u;
    a[0][0] = __byte_perm(w0, k64, 0x4140), a[0][1] = __byte_perm(w0, k64, 0x4342);
    a[1][0] = __byte_perm(w1, k64, 0x4140), a[1][1] = __byte_perm(w1, k64, 0x4342);
  } else {  // byte i: dimension i in the low nibble, i + 16 in the high one
    const uint32_t w = ld4<kQ + 16 * kBlk>(row, 4 * t4);
    const uint32_t lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu;
    a[0][0] = __byte_perm(lo, k64, 0x4140), a[0][1] = __byte_perm(lo, k64, 0x4342);
    a[1][0] = __byte_perm(hi, k64, 0x4140), a[1][1] = __byte_perm(hi, k64, 0x4342);
  }
}
// The offset of a level as a half (1024 + stored byte or nibble = kOff + level).
template <DType T>
constexpr float kOff = T == DType::Q8_0   ? 1152.0f
                       : T == DType::Q4_0 ? 1032.0f
                                          : 0.0f;

// One key's V row, block J, as the lane with column gr reads it: 4 dimensions in one word
// (f16: two words), and the block's scale from the row's scales ds (0 for a key past the tile:
// its row is stale).
template <DType T>
struct VWord {
  uint32_t w[T == DType::F16 ? 2 : 1];
  __half d;
};
template <DType T, int D, int J>
__device__ __forceinline__ VWord<T> v_word(const uint8_t* row, int gr, bool live,
                                           const Scales<D / 32>& ds) {
  const __half d = ds.h[J];
  constexpr int kQ = D / 16;
  VWord<T> r;
  if constexpr (T == DType::F16) {
    const uint2 w = *reinterpret_cast<const uint2*>(row + 64 * J + 8 * gr);
    r.w[0] = live ? w.x : 0u, r.w[1] = live ? w.y : 0u;
    r.d = __float2half(1.0f);
  } else if constexpr (T == DType::Q8_0) {  // dimensions 4 gr .. 4 gr + 3
    r.w[0] = ld4<kQ + 32 * J>(row, 4 * gr);
    r.d = live ? d : __ushort_as_half(0);
  } else {  // bytes 2 gr, 2 gr + 1: dimensions 2 gr, 2 gr + 1 (low), 16 + 2 gr, 17 + 2 gr (high)
    r.w[0] = *reinterpret_cast<const uint16_t*>(row + kQ + 16 * J + 2 * gr);
    r.d = live ? d : __ushort_as_half(0);
  }
  return r;
}
// Row j (0-3) of the lane's 4 dimensions of a block for keys a and b, as the A operand of
// O^T += V^T P'^T: j = 0, 1 feed the block's first 16-row tile (rows gr, gr + 8), 2, 3 its
// second. q4_0: j = 0, 1 the low nibbles of bytes 0, 1, j = 2, 3 the high ones (as 16 x level).
template <DType T>
__device__ __forceinline__ uint32_t v_pair(const VWord<T>& a, const VWord<T>& b, int j) {
  if constexpr (T == DType::F16) {
    return __byte_perm(a.w[j / 2], b.w[j / 2], j % 2 ? 0x7632 : 0x5410);
  } else if constexpr (T == DType::Q8_0) {
    const uint32_t x = __byte_perm(a.w[0], b.w[0], j | j << 4 | (4 + j) << 8 | (4 + j) << 12);
    return (x & 0x00FF00FFu) ^ 0x64806480u;  // level ^ 0x80 under 0x64: 1152 + level
  } else {
    const int k = j % 2;
    const uint32_t x = __byte_perm(a.w[0], b.w[0], k | k << 4 | (4 + k) << 8 | (4 + k) << 12);
    return (x & (j < 2 ? 0x000F000Fu : 0x00F000F0u)) | 0x64006400u;
  }
}
// The output dimension of row gr + 8 e of tile 2 J + h, and what O' of that tile is turned
// into O with: O = (O' - off sum P') * mul.
template <DType T>
__device__ __forceinline__ int v_dim(int J, int h, int gr, int e) {
  return T == DType::Q4_0 ? 32 * J + 16 * h + 2 * gr + e : 32 * J + 4 * gr + 2 * h + e;
}

__device__ __forceinline__ uint32_t movt(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}
__device__ __forceinline__ uint32_t hmul2u(uint32_t a, __half lo, __half hi) {
  const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&a), __halves2half2(lo, hi));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// Bytes of shared memory a decode warp owns: its stages, which after its tiles hold its
// partial ([ng][D] outputs, [ng] maxima and sums, and for a fold in place the state's [ng]
// maxima and sums; with a block per span the four warps' space holds theirs, the factors and
// the span's maxima and sums and the state's: 4 ng (D + 4) floats in all).
__host__ __device__ constexpr int dt_warp_bytes(int stages, int kst, int vst, int ng, int d) {
  const int tiles = stages * kDtKeys * (kst + vst), partial = ng * (d + 4) * 4;
  return ((tiles > partial ? tiles : partial) + 15) / 16 * 16;
}

// The fold inside a decode launch (blocks > 0): its warps are the blocks after the spans' and
// wait for each chunk's partials by their flags ([part][kv head]), which each span's warp (or
// block) sets to the launch's number once its partial is written. The number is ctl[0] + 1, read
// by every warp at its start; the last fold warp to finish (ctl[1] counts them) stores it in
// ctl[0] for the next launch, after every warp of this one has read it. The fold's blocks come
// last, so they take the places the spans' last wave leaves free.
// The numbers are unsigned: they wrap after 2^32 launches (days of decoding) without harm.
struct FoldSync {
  unsigned* flags;
  unsigned* ctl;
  int blocks;
};
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
constexpr int kInlineFoldStages = 2;

// Two ways to split the work (kByWarp, decode_split): a block per (span, kv head), each
// warp a quarter of the span's keys, merged in warp order (many warps for a short context),
// or a warp per (part, kv head), 4 to a block, a part being the whole span or one of its
// `parts` runs of keys in order, each warp writing (or folding) its partial itself: no merge,
// no barrier (a split span spends a third of its time starting and merging at a page of 256
// keys; from 24K tokens of 8 kv heads on, a warp per span is faster on the H200, 3-9 % up to
// 48K and 8 % at 128K). The parts of a span are spans of their own to the fold. Either way the
// keys a warp takes depend on the span and the split alone. A warp per span may hold the fold
// (FoldSync; for a block per span it lost 2 % at 16K on the H200). kEarly (recorded steps
// only; KVS_ATTN_EARLY=0: off): a warp whose span is not the call's last issues its first
// copies before pdl_wait().
// Only q and the last span's new row come from the kernel before; everything older is done when
// a kernel launched early starts, the staged span table and positions included (a recorded
// step copies them before its first kernel).
template <DType K, DType V, int D, bool kByWarp, bool kEarly = false>
__global__ void __launch_bounds__(32 * kDtWarps, kDtBlocks)
    decode_tc(Geo g, float* part, int n_kv, int kst, int vst, int cw, FoldSync fs) {
  static_assert(head_bytes<K, D>() % (D / 16) == 0 && head_bytes<V, D>() % (D / 16) == 0,
                "heads start (D / 16)-byte aligned in shared memory (ld4, ld_scales)");
  if constexpr (!kEarly) pdl_wait();
  constexpr int kSt = dt_stages<K, V, D>(), kB = D / 32;
  constexpr bool kQK = K != DType::F16, kQV = V != DType::F16;
  extern __shared__ __align__(16) uint8_t dt_smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, t4 = lane % 4;
  const int ng = g.group, item = kByWarp ? blockIdx.x * kDtWarps + warp : blockIdx.x;
  const int n_items = g.n_spans * n_kv;
  // [kSt][kDtKeys][kst], [kDtKeys][vst]; after the tiles, the partials (or the fold's ring)
  uint8_t* raw = dt_smem + warp * dt_warp_bytes(kSt, kst, vst, ng, D);
  unsigned tok = 0;  // this launch's number, with the fold inside it (FoldSync)
  if (kByWarp && fs.blocks > 0) {
    tok = *reinterpret_cast<volatile unsigned*>(fs.ctl) + 1u;
    const int spans_blocks = kByWarp ? (n_items + kDtWarps - 1) / kDtWarps : n_items;
    if (static_cast<int>(blockIdx.x) >= spans_blocks) {  // a fold warp: (head, 32 dimensions)
      if constexpr (kEarly) pdl_wait();
      const int fi = (blockIdx.x - spans_blocks) * kDtWarps + warp, n_fold = g.n_head * (D / 32);
      if (fi >= n_fold) return;
      const int h = fi / (D / 32), hf = h / ng;
      fold_run<32, kInlineFoldStages>(g, part, h, fi % (D / 32), raw, [&](int c) {
        const int sp = c * 32 + lane;
        if (sp < g.n_spans)
          while (ld_acquire(fs.flags + sp * n_kv + hf) != tok) __nanosleep(128);
        __syncwarp();
      });
      __syncwarp();
      if (lane == 0) {
        __threadfence();
        if (atomicAdd(fs.ctl + 1, 1u) == static_cast<unsigned>(n_fold - 1)) {  // the last:
          fs.ctl[1] = 0;  // number the next launch
          __threadfence();
          atomicExch(fs.ctl, tok);
        }
      }
      return;
    }
  }
  if (item >= n_items) return;                     // (by warp: whole warps)
  const int s = item / n_kv, hk = item % n_kv;
  const int stage_bytes = kDtKeys * (kst + vst);
  // This warp's partial is written: its flag for the fold in this launch (a warp per span).
  const auto signal = [&] {
    if (!kByWarp || fs.blocks == 0) return;
    __threadfence();
    __syncwarp();
    if (lane == 0) st_release(fs.flags + item, tok);
  };
  const Span sp = g.spans[s];
  const size_t stride = part_stride(D);
  float* pout = part + (static_cast<size_t>(s) * g.n_head + hk * ng) * stride;
  // The only span of the call folded into the state here, as decode_fold would (the same
  // steps on the same values, so how spans fall into calls does not change the result): by
  // the threads t0, t0 + nt, ... < ng * D, from the span's [ng][D] output o and its [ng] maxima
  // and sums ml (when live).
  const auto fold_here = [&](bool live, const float* o, const float* ml, float* st, int t0,
                             int nt) {
    // The state of every row, read before any of it is written (a row spans several passes of
    // a warp).
    for (int r = t0; r < ng; r += nt) {
      const int h = hk * ng + r;
      st[2 * r] = g.first ? 0.0f : g.acc[2 * h], st[2 * r + 1] = g.first ? 0.0f : g.acc[2 * h + 1];
    }
    if constexpr (kByWarp)
      __syncwarp();
    else
      __syncthreads();
    for (int i = t0; i < ng * D; i += nt) {  // whole warps: D % 32 == 0
      const int r = i / D, c = i % D, h = hk * ng + r;
      const float m0 = st[2 * r], l0 = st[2 * r + 1];
      const bool any = l0 != 0.0f;
      const float run = any ? m0 : -INFINITY, pm = live ? ml[2 * r] : 0.0f;
      const float after = live ? fmaxf(pm, run) : run;
      const FoldStep f = fold_step(live, !any, run, after, pm);
      const float l = fmaf(l0, f.ea, live ? ml[2 * r + 1] * f.eb : 0.0f);
      const float o0 = any ? g.out[h * D + c] : 0.0f, cur = live ? o[r * D + c] : 0.0f;
      fold_write(g, h, c, live || any ? after : m0, l, fold_out(o0, f, cur));
    }
  };
  // The span's [ng][D] output o and [ng] maxima and sums ml: folded here (st: scratch for the
  // state) or written as its partial.
  const auto finish = [&](const float* o, const float* ml, float* st, int t0, int nt) {
    if (g.fold_in_place) return fold_here(true, o, ml, st, t0, nt);
    for (int i = t0; i < ng * D; i += nt) pout[i / D * stride + kPartO + i % D] = o[i];
    for (int r = t0; r < ng; r += nt)
      pout[r * stride] = ml[2 * r], pout[r * stride + 1] = ml[2 * r + 1],
               pout[r * stride + 2] = 1.0f;
  };
  // The keys the query sees (none past its position: an empty partial).
  const int n = min(sp.n, g.pos[0] - sp.start + 1);
  if (n <= 0) {
    if constexpr (kEarly) pdl_wait();
    const int t0 = kByWarp ? lane : threadIdx.x, nt = kByWarp ? 32 : blockDim.x;
    if (g.fold_in_place)
      fold_here(false, nullptr, nullptr, reinterpret_cast<float*>(kByWarp ? raw : dt_smem), t0, nt);
    else
      for (int r = t0; r < ng; r += nt) pout[r * stride + 2] = 0.0f;
    signal();
    return;
  }
  // This warp's keys: the span (warp), or a quarter of it in whole tiles (block).
  int k_lo = 0, k_hi = n;
  if (!kByWarp) {
    const int per = ((n + kDtWarps - 1) / kDtWarps + kDtKeys - 1) / kDtKeys * kDtKeys;
    k_lo = min(n, warp * per), k_hi = min(n, k_lo + per);
  }
  const int n_tiles = (k_hi - k_lo + kDtKeys - 1) / kDtKeys;

  // Copies: two lanes a row, every other piece each; the sources advance a tile at a time.
  const HeadCopy kc = head_copy(hk, g.k_head, cw), vc = head_copy(hk, g.v_head, cw);
  const int cr = lane / 2, c0 = lane % 2;
  const uint8_t* ksrc =
      sp.page + hk * g.k_head - kc.shift + static_cast<size_t>(k_lo + cr) * g.k_row;
  const uint8_t* vsrc =
      sp.page + g.v_offset + hk * g.v_head - vc.shift + static_cast<size_t>(k_lo + cr) * g.v_row;
  const size_t kstep = kDtKeys * g.k_row, vstep = kDtKeys * g.v_row;
  uint8_t* kdst = raw + cr * kst;
  uint8_t* vdst = raw + kDtKeys * kst + cr * vst;
  const unsigned kdst16 = static_cast<unsigned>(__cvta_generic_to_shared(kdst + 16 * c0));
  const unsigned vdst16 = static_cast<unsigned>(__cvta_generic_to_shared(vdst + 16 * c0));
  int krow = k_lo + cr, off = 0;   // off: the stage tile t goes to
  const auto issue = [&](int t) {  // t: 0, 1, 2, ... in order
    if (t < n_tiles && krow < k_hi) {
      if (cw == 16) {  // whole rows 16-byte aligned: the usual case
        cp_row16<(head_bytes<K, D>() + 30) / 16>(kdst16 + off, ksrc + 16 * c0, kc.pieces, c0);
        cp_row16<(head_bytes<V, D>() + 30) / 16>(vdst16 + off, vsrc + 16 * c0, vc.pieces, c0);
      } else {
        for (int c = c0; c < kc.pieces; c += 2) cp_async(kdst + off + c * cw, ksrc + c * cw, cw);
        for (int c = c0; c < vc.pieces; c += 2) cp_async(vdst + off + c * cw, vsrc + c * cw, cw);
      }
    }
    ksrc += kstep, vsrc += vstep, krow += kDtKeys;
    off = off == (kSt - 1) * stage_bytes ? 0 : off + stage_bytes;
    cp_commit();
  };
  // Q^T as the B operand: column gr is head hk * ng + gr (zero past the group), k-step ks holds
  // dimensions 16 ks + 4 t4 + {0, 1} (qb[ks][0]) and + {2, 3} (qb[ks][1]), K's map. Loaded
  // before the copies are issued, so its latency overlaps theirs (kEarly: after them, but for
  // the last span, whose new row the kernel before writes).
  const bool early = kEarly && s + 1 < g.n_spans;
  if (early)
#pragma unroll
    for (int t = 0; t < kSt - 1; ++t) issue(t);
  if constexpr (kEarly) pdl_wait();
  float4 qf[D / 16];
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks)
    qf[ks] = gr < ng ? *reinterpret_cast<const float4*>(g.q + (hk * ng + gr) * D + 16 * ks + 4 * t4)
                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (!early)
#pragma unroll
    for (int t = 0; t < kSt - 1; ++t) issue(t);
  uint32_t qb[D / 16][2];
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks)
    qb[ks][0] = h2u(qf[ks].x, qf[ks].y), qb[ks][1] = h2u(qf[ks].z, qf[ks].w);
  constexpr uint32_t kOnes = 0x3C003C00u;  // two halves 1.0
  const uint32_t ones[4] = {kOnes, kOnes, kOnes, kOnes};
  // kOff<K> times each block's sum of the halves of q, for heads 2 t4 and 2 t4 + 1.
  float cq[kB][2] = {};
  if constexpr (kQK)
#pragma unroll
    for (int b = 0; b < kB; ++b) {
      float c[4] = {};
      mma16816(c, ones, qb[2 * b][0], qb[2 * b][1]);
      mma16816(c, ones, qb[2 * b + 1][0], qb[2 * b + 1][1]);
      cq[b][0] = kOff<K> * c[0], cq[b][1] = kOff<K> * c[1];
    }

  // The running max and (this lane's share of the) sum of heads 2 t4 and 2 t4 + 1; O'^T in
  // tiles of 16 dimensions, and for quantized V the sums of P' per block.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, o[D / 16][4] = {}, cv[kB][4] = {};
  int cur = 0;  // the stage of tile t
  for (int t = 0; t < n_tiles; ++t) {
    issue(t + kSt - 1);
    cp_wait<kSt - 1>();
    __syncwarp();
    const int nk = min(kDtKeys, k_hi - k_lo - t * kDtKeys);
    const uint8_t* rk = raw + cur + kc.shift;
    const uint8_t* rv = raw + cur + kDtKeys * kst + vc.shift;
    cur = cur == (kSt - 1) * stage_bytes ? 0 : cur + stage_bytes;
    // S^T: rows keys gr and gr + 8, columns heads 2 t4, 2 t4 + 1.
    float sc[4] = {};
    const uint8_t* kg = rk + gr * kst;
    const uint8_t* kh = rk + (gr + 8) * kst;
    Scales<kB> dkg{}, dkh{};  // the rows' block scales
    if constexpr (kQK) dkg = ld_scales<kB>(kg), dkh = ld_scales<kB>(kh);
    const auto k_step = [&]<int kBlk>() {
      uint32_t ag[2][2], ah[2][2];
      k_block<K, D, kBlk>(kg, t4, ag);
      k_block<K, D, kBlk>(kh, t4, ah);
      float c[4] = {};
      float* acc = kQK ? c : sc;
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const uint32_t a[4] = {ag[u][0], ah[u][0], ag[u][1], ah[u][1]};
        mma16816(acc, a, qb[2 * kBlk + u][0], qb[2 * kBlk + u][1]);
      }
      if constexpr (kQK) {
        const float dg = __half2float(dkg.h[kBlk]), dh = __half2float(dkh.h[kBlk]);
        sc[0] = fmaf(dg, c[0] - cq[kBlk][0], sc[0]), sc[1] = fmaf(dg, c[1] - cq[kBlk][1], sc[1]);
        sc[2] = fmaf(dh, c[2] - cq[kBlk][0], sc[2]), sc[3] = fmaf(dh, c[3] - cq[kBlk][1], sc[3]);
      }
    };
    [&]<int... kI>(std::integer_sequence<int, kI...>) {
      (k_step.template operator()<kI>(), ...);
    }
    (std::make_integer_sequence<int, kB>{});
    // The online softmax of heads 2 t4 + e (a head's 16 keys are spread over the 8 lanes of
    // its t4 and rows gr, gr + 8): scores in natural units as the partials keep them, each
    // probability one ex2.
    const bool lg = gr < nk, lh = gr + 8 < nk;
    float p[4], al[2];
    bool moved = false;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float x0 = lg ? sc[e] * g.scale : -INFINITY, x1 = lh ? sc[2 + e] * g.scale : -INFINITY;
      float mx = fmaxf(x0, x1);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
      mx = fmaxf(m[e], fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16)));  // key 0: finite
      const float mu = mx * kLog2e;
      p[e] = ex2(fmaf(x0, kLog2e, -mu)), p[2 + e] = ex2(fmaf(x1, kLog2e, -mu));
      al[e] = m[e] == -INFINITY ? 0.0f : ex2(fmaf(m[e], kLog2e, -mu));
      l[e] = fmaf(l[e], al[e], p[e] + p[2 + e]);
      moved |= m[e] != mx;
      m[e] = mx;
    }
    if (__any_sync(0xffffffffu, moved)) {  // most tiles keep the max
#pragma unroll
      for (int j = 0; j < D / 16; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[j][e] *= al[e % 2];
#pragma unroll
      for (int b = 0; b < kB; ++b)
#pragma unroll
        for (int e = 0; e < 4; ++e) cv[b][e] *= al[e % 2];
    }
    // P^T as the B operand: keys 2 t4 + {0, 1} (pb0) and 8 + 2 t4 + {0, 1} (pb1) of head gr.
    const uint32_t pb0 = movt(h2u(p[0], p[1])), pb1 = movt(h2u(p[2], p[3]));
    const int ka = 2 * t4;
    const uint8_t* va_row = rv + ka * vst;
    Scales<kB> dv[4] = {};  // the block scales of keys ka, ka + 1, ka + 8, ka + 9
    if constexpr (kQV)
      dv[0] = ld_scales<kB>(va_row), dv[1] = ld_scales<kB>(va_row + vst),
      dv[2] = ld_scales<kB>(va_row + 8 * vst), dv[3] = ld_scales<kB>(va_row + 9 * vst);
    const auto v_step = [&]<int J>() {
      const VWord<V> a = v_word<V, D, J>(va_row, gr, ka < nk, dv[0]);
      const VWord<V> b = v_word<V, D, J>(va_row + vst, gr, ka + 1 < nk, dv[1]);
      const VWord<V> c = v_word<V, D, J>(va_row + 8 * vst, gr, ka + 8 < nk, dv[2]);
      const VWord<V> d = v_word<V, D, J>(va_row + 9 * vst, gr, ka + 9 < nk, dv[3]);
      const uint32_t b0 = kQV ? hmul2u(pb0, a.d, b.d) : pb0, b1 = kQV ? hmul2u(pb1, c.d, d.d) : pb1;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t av[4] = {v_pair<V>(a, b, 2 * h), v_pair<V>(a, b, 2 * h + 1),
                                v_pair<V>(c, d, 2 * h), v_pair<V>(c, d, 2 * h + 1)};
        mma16816(o[2 * J + h], av, b0, b1);
      }
      if constexpr (kQV) mma16816(cv[J], ones, b0, b1);
    };
    [&]<int... kI>(std::integer_sequence<int, kI...>) {
      (v_step.template operator()<kI>(), ...);
    }
    (std::make_integer_sequence<int, kB>{});
    __syncwarp();  // the stage is refilled by a later tile's copy
  }
  asm volatile("cp.async.wait_all;\n" ::);
#pragma unroll
  for (int e = 0; e < 2; ++e) {  // the sums over the 8 lanes of a head
    l[e] += __shfl_xor_sync(0xffffffffu, l[e], 4);
    l[e] += __shfl_xor_sync(0xffffffffu, l[e], 8);
    l[e] += __shfl_xor_sync(0xffffffffu, l[e], 16);
  }
  // The warp's partial: [ng][D] outputs and [ng] maxima and sums, in its own space (by warp) or
  // the block's (the warps' [4][ng][D], then [4][ng][2]).
  float* red = reinterpret_cast<float*>(kByWarp ? raw : dt_smem);
  float* ml = red + (kByWarp ? 1 : kDtWarps) * ng * D;
  float* wo = red + (kByWarp ? 0 : warp * ng * D);
  float* wml = ml + (kByWarp ? 0 : 2 * warp * ng);
  if constexpr (kByWarp)
    __syncwarp();
  else
    __syncthreads();  // every tile done: the space is free
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int r = 2 * t4 + e;
    if (r >= ng) continue;
#pragma unroll
    for (int J = 0; J < kB; ++J)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float off = V == DType::Q4_0 ? (h ? 1152.0f : 1032.0f) : kOff<V>;
        const float mul = V == DType::Q4_0 && h ? 1.0f / 16.0f : 1.0f;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float v =
              kQV ? (o[2 * J + h][2 * i + e] - off * cv[J][e]) * mul : o[2 * J + h][2 * i + e];
          wo[r * D + v_dim<V>(J, h, gr, i)] = v;
        }
      }
    if (gr == 0) wml[2 * r] = m[e], wml[2 * r + 1] = l[e];
  }
  if constexpr (kByWarp) {
    __syncwarp();
    finish(red, ml, ml + 2 * ng, lane, 32);
    return signal();
  }
  // A block per span: the warps' partials merge in warp order into the span's, in the space
  // of warp 0's output (each row's max over the warps and each warp's factor once; a warp
  // without keys has factor 0 and outputs 0, adding exact zeros).
  float* fac = ml + 2 * kDtWarps * ng;
  float* sml = fac + kDtWarps * ng;  // the span's [ng] maxima and sums
  __syncthreads();
  if (threadIdx.x < ng) {
    const int r = threadIdx.x;
    float mm = -INFINITY;
    for (int w = 0; w < kDtWarps; ++w)
      if (ml[2 * (w * ng + r) + 1] != 0.0f) mm = fmaxf(mm, ml[2 * (w * ng + r)]);
    for (int w = 0; w < kDtWarps; ++w) fac[w * ng + r] = expf(ml[2 * (w * ng + r)] - mm);
    float sum = 0.0f;
    for (int w = 0; w < kDtWarps; ++w) {
      const float lw = ml[2 * (w * ng + r) + 1];
      if (lw != 0.0f) sum += lw * fac[w * ng + r];
    }
    sml[2 * r] = mm, sml[2 * r + 1] = sum;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < ng * D; i += blockDim.x) {
    const int r = i / D;
    float acc = 0.0f;
#pragma unroll
    for (int w = 0; w < kDtWarps; ++w) acc += red[w * ng * D + i] * fac[w * ng + r];
    red[i] = acc;  // each thread reads only its own elements
  }
  __syncthreads();
  finish(red, sml, sml + 2 * ng, threadIdx.x, blockDim.x);
  signal();
}

// Dynamic shared memory above 48 KiB has to be allowed once per kernel.
template <class F>
void allow_smem(F* kernel, size_t bytes) {
  // Kernels of one signature share F, so the sizes are kept per kernel address.
  static std::mutex mu;
  static std::unordered_map<const void*, size_t> allowed;
  const std::lock_guard<std::mutex> lock(mu);
  size_t& a = allowed[reinterpret_cast<const void*>(kernel)];
  if (bytes <= a) return;
  KVS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(bytes)));
  a = bytes;
}

// The widest cp.async every K and V row of the layout allows (frames are 256-byte aligned).
int copy_width(const Geo& g) {
  const auto aligned = [&](size_t w) {
    return g.k_head % w == 0 && g.v_head % w == 0 && g.k_row % w == 0 && g.v_row % w == 0 &&
           g.v_offset % w == 0;
  };
  return aligned(16) ? 16 : aligned(8) ? 8 : aligned(4) ? 4 : 2;
}

// The tensor-core kernels' copies (head_copy): the piece width, and the shared-memory row
// strides of K and V that hold the largest copy of a head (16-byte multiples).
struct HeadCopies {
  int kst, vst, cw;
};
HeadCopies head_copies(const Geo& g, int n_kv) {
  const bool rows16 = g.k_row % 16 == 0 && g.v_row % 16 == 0 && g.v_offset % 16 == 0;
  const int cw = rows16 ? 16 : copy_width(g);
  const auto stride = [&](size_t head) {
    size_t most = 0;
    for (int h = 0; h < n_kv; ++h) {
      const size_t shift = h * head % cw;
      most = std::max(most, (shift + head + cw - 1) / cw * cw);
    }
    return static_cast<int>((most + 15) / 16 * 16);
  };
  return {stride(g.k_head), stride(g.v_head), cw};
}

template <int D>
void launch_prefill_tc(Ctx& c, const Geo& g, int n_kv) {
  const size_t smem = sizeof(__half) * 4 * kTcKeys * (D + 8);
  allow_smem(prefill_tc<D>, smem);
  const int tq = kTcRows / g.group;
  launch(prefill_tc<D>, dim3((g.n_tok + tq - 1) / tq, n_kv), kTcThreads, smem, c.stream, g);
}

template <DType K, DType V, int D>
void launch_prefill(Ctx& c, const Geo& g, const KvLayout& l) {
  const int n_kv = l.n_head_kv;
  if constexpr (D == 64 || D == 128) {
    if constexpr (K == DType::F16 && V == DType::F16) {
      return launch_prefill_tc<D>(c, g, n_kv);
    } else {
      if (g.n_spans == 0) return launch_prefill_tc<D>(c, g, n_kv);  // only the state's end
      // The spans in chunks whose f16 copy fits half the scratch (reserved by the device),
      // each converted, then attended to as an f16 cache; the running max, sum and output
      // carry from chunk to chunk as from call to call. With more than one chunk, chunk i + 1
      // converts on the side stream into the other half while chunk i is attended to (the
      // attention, one block an SM, leaves room beside it), unless a graph is being recorded.
      const size_t page16 = 2 * static_cast<size_t>(l.page_size) * n_kv * D * sizeof(__half);
      const size_t room = std::max(c.kv16.size(), std::min(kKv16Bytes, g.n_spans * page16));
      const bool one = g.n_spans * page16 <= room;
      const int per = one ? g.n_spans : static_cast<int>(std::max<size_t>(1, room / 2 / page16));
      const int halves = one ? 1 : 2;
      __half* kv16 = c.scratch_kv16(halves * static_cast<size_t>(per) * page16);
      Span* spans16 = c.scratch_spans16(halves * per);
      cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
      KVS_CUDA_CHECK(cudaStreamIsCapturing(c.stream, &cap));
      const bool side = !one && cap == cudaStreamCaptureStatusNone && c.side;
      const int blocks_y = (2 * l.page_size * n_kv * (D / 8) + 8 * 256 - 1) / (8 * 256);
      const auto convert = [&](int i, cudaStream_t st) {
        const int s0 = i * per, n = std::min(per, g.n_spans - s0), b = i % halves;
        if (side) KVS_CUDA_CHECK(cudaStreamWaitEvent(st, c.consumed[b]));
        launch(kv_to_f16<K, V, D>, dim3(n, blocks_y), 256, 0, st, g, s0, l.page_size, n_kv,
               kv16 + b * per * page16 / sizeof(__half), spans16 + b * per);
        if (side) KVS_CUDA_CHECK(cudaEventRecord(c.converted[b], st));
      };
      const int chunks = (g.n_spans + per - 1) / per;
      if (side) {
        KVS_CUDA_CHECK(cudaEventRecord(c.side_ready, c.stream));
        KVS_CUDA_CHECK(cudaStreamWaitEvent(c.side, c.side_ready));
      }
      convert(0, side ? c.side : c.stream);
      for (int i = 0; i < chunks; ++i) {
        const int s0 = i * per, n = std::min(per, g.n_spans - s0), b = i % halves;
        if (side) KVS_CUDA_CHECK(cudaStreamWaitEvent(c.stream, c.converted[b]));
        Geo h = g;
        h.spans = spans16 + b * per, h.n_spans = n;
        h.k_row = h.v_row = static_cast<size_t>(n_kv) * D * sizeof(__half);
        h.k_head = h.v_head = D * sizeof(__half);
        h.v_offset = static_cast<size_t>(l.page_size) * h.k_row;
        h.first = g.first && s0 == 0, h.last = g.last && s0 + n == g.n_spans;
        launch_prefill_tc<D>(c, h, n_kv);
        if (side) KVS_CUDA_CHECK(cudaEventRecord(c.consumed[b], c.stream));
        if (i + 1 < chunks) convert(i + 1, side ? c.side : c.stream);
      }
    }
  } else {
    using T = Tile<D>;
    allow_smem(prefill<K, V, D>, T::kSmem);
    const int tq = T::kRows / g.group;
    launch(prefill<K, V, D>, dim3((g.n_tok + tq - 1) / tq, n_kv), kPreThreads, T::kSmem, c.stream,
           g);
  }
}

}  // namespace

bool decode_by_warp(const Ctx& c, const KvLayout& l, int64_t n_ctx) {
  if (c.decode_split != CudaOptions::DecodeSplit::Auto)
    return c.decode_split == CudaOptions::DecodeSplit::WarpPerSpan;
  // A warp per span once the context has a (span, kv head) pair for each warp of one block an
  // SM: 16.5K tokens of 8 kv heads at pages of 256 on the H200. There, with q8_0 K and q8_0 or
  // q4_0 V, a block per span was 2 % faster at 8K, the two equal at 16K, a warp per span 6 %,
  // 3 % and 8 % faster at 24K, 32K and 48K.
  const int64_t items = (n_ctx + l.page_size - 1) / l.page_size * l.n_head_kv;
  return items >= int64_t{kDtWarps} * c.n_sm;
}

void attention(Ctx& c, const AttentionArgs& a, uint8_t* xq, bool by_warp) {
  const KvLayout& l = a.kv;
  const int d = l.head_dim, P = l.page_size;
  KVS_CHECK(d == 32 || d == 64 || d == 128 || d == 256, "cuda attention: head size ", d,
            " (32, 64, 128 or 256)");
  KVS_CHECK(P <= 2048, "cuda attention: --page-size ", P, " is above 2048");
  Geo g{a.q,       a.out,    a.acc,
        a.spans,   a.pos,    a.n_tok,
        a.n_spans, a.n_head, a.n_head / l.n_head_kv,
        d,         l.k_row,  l.v_row,
        l.k_head,  l.v_head, l.v_offset(),
        a.scale,   a.first,  a.last};
  g.xq = a.n_tok == 1 && a.last ? xq : nullptr;
  KVS_CHECK(g.group >= 1 && g.group <= kMaxGroup, "cuda attention: ", g.group,
            " query heads per kv head (at most ", kMaxGroup, ")");
  if (a.n_tok == 1) {
    if (a.n_spans > 0) {
      float* part = c.scratch_part(static_cast<size_t>(a.n_spans) * a.n_head * part_stride(d));
      bool fold_launched = false;  // by the attention's launch
      DecTile t;
      t.keys = d <= 128 ? 64 : 32;
      t.kst = static_cast<int>((l.k_head + 15) / 16 * 16);
      t.vst = static_cast<int>((l.v_head + 15) / 16 * 16);
      t.cw = copy_width(g);
      const size_t smem = 2 * static_cast<size_t>(t.keys) * (t.kst + t.vst);
      dispatch_kv(l.k_type, [&]<DType K>() {
        dispatch_kv(l.v_type, [&]<DType V>() {
          const dim3 grid(a.n_spans, l.n_head_kv);
          if (d == 64 || d == 128) {  // tensor cores
            const auto [kst, vst, cw] = head_copies(g, l.n_head_kv);
            const bool early = by_warp && c.attn_early && c.staged;
            const auto tc = d == 64 ? (early     ? decode_tc<K, V, 64, true, true>
                                       : by_warp ? decode_tc<K, V, 64, true>
                                                 : decode_tc<K, V, 64, false>)
                                    : (early     ? decode_tc<K, V, 128, true, true>
                                       : by_warp ? decode_tc<K, V, 128, true>
                                                 : decode_tc<K, V, 128, false>);
            const int stages = d == 64 ? dt_stages<K, V, 64>() : dt_stages<K, V, 128>();
            const size_t tc_smem =
                kDtWarps * static_cast<size_t>(dt_warp_bytes(stages, kst, vst, g.group, d));
            allow_smem(tc, tc_smem);
            // One span (a short context, or a ring chunk of one page): its block or warp folds it.
            g.fold_in_place = a.n_spans == 1;
            // (span, kv head): a warp or block each
            const int items = a.n_spans * l.n_head_kv;
            // The fold inside the launch when its warps fit a decode warp's shared memory and
            // half the blocks the GPU holds at once hold them twice over (its warps wait for the
            // spans' flags: the spans' blocks must always find room).
            FoldSync fs{};
            const int fold_blocks = (a.n_head * (d / 32) + kDtWarps - 1) / kDtWarps;
            if (by_warp && !g.fold_in_place &&
                dt_warp_bytes(stages, kst, vst, g.group, d) >= fold_bytes(32, kInlineFoldStages) &&
                2 * fold_blocks <= c.n_sm * resident(tc, 32 * kDtWarps, tc_smem)) {
              unsigned* buf = c.scratch_flags(2 + static_cast<size_t>(items));
              fs = {buf + 2, buf, fold_blocks};
              fold_launched = true;
            }
            launch(tc, dim3((by_warp ? (items + kDtWarps - 1) / kDtWarps : items) + fs.blocks),
                   32 * kDtWarps, tc_smem, c.stream, g, part, l.n_head_kv, kst, vst, cw, fs);
            return;
          }
          const auto run = [&](auto kernel) {
            allow_smem(kernel, smem);
            launch(kernel, grid, kDecThreads, smem, c.stream, g, part, t);
          };
          if (g.group <= 4 && d <= 128)
            run(decode_partials<K, V, 4, 4>);
          else if (g.group <= 4)
            run(decode_partials<K, V, 4, 8>);
          else if (d <= 128)
            run(decode_partials<K, V, 8, 4>);
          else
            run(decode_partials<K, V, 8, 8>);
        });
      });
      if (!g.fold_in_place && !fold_launched)
        launch(decode_fold, fold_grid(g), 32, 0, c.stream, g, part);
    } else {
      launch(decode_fold, fold_grid(g), 32, 0, c.stream, g, nullptr);
    }
    return;
  }
  dispatch_kv(l.k_type, [&]<DType K>() {
    dispatch_kv(l.v_type, [&]<DType V>() {
      switch (d) {
        case 32:
          return launch_prefill<K, V, 32>(c, g, l);
        case 64:
          return launch_prefill<K, V, 64>(c, g, l);
        case 128:
          return launch_prefill<K, V, 128>(c, g, l);
        default:
          return launch_prefill<K, V, 256>(c, g, l);
      }
    });
  });
}

#ifdef KVS_TRACE
KVS_TRACE_BIND(trace_bind_attention)
#endif

}  // namespace kvs::cuda
