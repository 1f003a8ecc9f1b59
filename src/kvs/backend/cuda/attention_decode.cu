// Decode attention: one token's query heads against the spans of a call, continuing a running
// state (max, sum, unnormalised output) across calls exactly as the CPU kernel does. One block
// per (span, kv head) on CUDA cores (decode_partials, head size 32, and 256 where a block's
// shared memory cannot hold the tensor-core kernel's tiles; attention_decode_tc.cu takes the
// others) computes the partial of every query head of the group, then the fold
// (attention_fold.cuh) merges the partials into the state in span order.
#include "kvs/backend/cuda/attention_fold.cuh"
#include "kvs/backend/cuda/attention_tile.cuh"

namespace kvs::cuda {
namespace {

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

// Rows [0, n) of w pieces of cw bytes each, from src (rows src_stride apart) to shared dst
// (rows dst_stride apart); thread tid of nt takes every nt-th piece. A piece's row and column
// advance by adding: a division by the runtime w per piece would cost more than the copy.
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
// A decode block's span: the keys [j0, j0 + n) the query sees (none past its position or
// before its window; the count returned) and where the partials of its kv head's query heads
// go; an empty span marks them empty.
__device__ __forceinline__ int decode_span(const Geo& g, float* part, int s, int hk, float*& pout,
                                           int& j0) {
  const Span sp = g.spans[s];
  const int n = min(sp.n, g.pos[0] - sp.start + 1);
  j0 = min(max(first_key(g, g.pos[0]) - sp.start, 0), max(n, 0));
  const size_t stride = part_stride(g.d);
  pout = part + (static_cast<size_t>(s) * g.n_head + hk * g.group) * stride;
  if (n - j0 <= 0)
    for (int r = threadIdx.x; r < g.group; r += blockDim.x) pout[r * stride + 2] = 0.0f;
  return n - j0;
}

constexpr int kDecThreads = 128;
constexpr int kDecWarps = kDecThreads / 32;

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
  int j0;
  const int n = decode_span(g, part, s, hk, pout, j0);
  if (n <= 0) return;
  const int tk = t.keys, buf_bytes = tk * (t.kst + t.vst);
  const uint8_t* kg = sp.page + static_cast<size_t>(j0) * g.k_row + hk * g.k_head;
  const uint8_t* vg = sp.page + g.v_offset + static_cast<size_t>(j0) * g.v_row + hk * g.v_head;
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


// Decode, step 2: the fold as a launch of its own, in passes of kFoldChunk spans.
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

}  // namespace

void attention_fold(Ctx& c, const Geo& g, const float* part) {
  launch(decode_fold, fold_grid(g), 32, 0, c.stream, g, part);
}

void attention_decode(Ctx& c, Geo& g, const KvLayout& l, bool by_warp) {
  if (g.n_spans == 0) {  // only the state's end
    launch(decode_fold, fold_grid(g), 32, 0, c.stream, g, nullptr);
    return;
  }
  const int d = g.d;
  float* part = c.scratch_part(static_cast<size_t>(g.n_spans) * g.n_head * part_stride(d));
  bool fold_launched = false;  // by the attention's launch
  // Tensor cores for heads of 256 where a block's shared memory holds their tiles.
  if (d == 64 || d == 128 || (d == 256 && decode_tc_fits(c, g, l))) {
    fold_launched = launch_decode_tc(c, g, l, by_warp, part);
  } else {
    DecTile t;
    t.keys = d <= 128 ? 64 : 32;
    t.kst = static_cast<int>((l.k_head + 15) / 16 * 16);
    t.vst = static_cast<int>((l.v_head + 15) / 16 * 16);
    t.cw = copy_width(g);
    const size_t smem = 2 * static_cast<size_t>(t.keys) * (t.kst + t.vst);
    dispatch_kv(l.k_type, [&]<DType K>() {
      dispatch_kv(l.v_type, [&]<DType V>() {
        const dim3 grid(g.n_spans, l.n_head_kv);
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
  }
  if (!g.fold_in_place && !fold_launched)
    launch(decode_fold, fold_grid(g), 32, 0, c.stream, g, part);
}

#ifdef KVS_TRACE
KVS_TRACE_BIND(trace_bind_attention_decode)
#endif

}  // namespace kvs::cuda
