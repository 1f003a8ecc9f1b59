// Decode attention on tensor cores, for head sizes 64, 128 and 256 and up to 8 query heads per
// kv head: one warp per (span, kv head), 4 to a block, the kv heads of a span next to each other
// so that the warps running together read whole K and V rows (or a block per (span, kv head) for
// a short context, decode_by_warp). A warp walks its span in tiles of 16 keys, up to kStages
// tiles in flight, and writes (or folds) the span's partial itself. Per tile: raw rows copied
// (cp.async) into the warp's part of shared memory, then two mma.sync m16n8k16 products per
// tile with the tile's 16 keys or 16 dimensions as the rows and the group's heads as the 8
// columns, so every accumulator is used: S^T = K Q^T, an online softmax per head, O^T += V^T
// P'^T, where P^T is S^T's accumulators transposed in registers (movmatrix). Quantized levels
// enter the products as the exact halves 1024 + level (the 0x6400 trick: two instructions per
// pair, no conversion, no scale): a K block's scale and offset are applied to its 32-dimension
// dot products (S = d (c - off sum q)), a V block's scale goes into P (P' = P d, per block) and
// its offset leaves O at the end (O = O' - off sum P', the sums from one more product against
// ones). Dimensions are permuted inside each product so that a lane's operands are whole
// 4-byte words of a row; the output columns follow the same map.
#include <algorithm>
#include <utility>

#include "kvs/backend/cuda/attention_fold.cuh"
#include "kvs/backend/cuda/attention_tile.cuh"

namespace kvs::cuda {
namespace {

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

constexpr int kDtKeys = 16, kDtWarps = 4;

// Bytes of one head's K or V row.
template <DType T, int D>
constexpr int head_bytes() {
  return T == DType::F16 ? 2 * D : T == DType::Q8_0 ? 34 * D / 32 : 18 * D / 32;
}
// Blocks an SM holds (the registers are bounded for it): 3, since at 4 (128 registers) the
// warps spill; 2 for heads of 256 (their accumulators take twice the registers). Tiles in
// flight per warp: as many (2 to 4) as let those blocks' stages stay within 174 KiB of an SM's
// shared memory with the usual row strides (a head padded to 16 bytes after a shift of 8), so
// that the rest stays L1, which the .ca copies go through.
template <int D>
constexpr int dt_blocks() {
  return D == 256 ? 2 : 3;
}
template <DType K, DType V, int D>
constexpr int dt_stages() {
  constexpr int pad_k = (head_bytes<K, D>() + 8 + 15) / 16 * 16;
  constexpr int pad_v = (head_bytes<V, D>() + 8 + 15) / 16 * 16;
  constexpr int stage = kDtWarps * kDtKeys * (pad_k + pad_v);
  constexpr int fit = 174 * 1024 / dt_blocks<D>() / stage;
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
  static_assert(kB == 2 || kB == 4 || kB == 8, "head sizes 64, 128 and 256");
  Scales<kB> r;
  if constexpr (kB == 8)
    *reinterpret_cast<uint4*>(r.h) = *reinterpret_cast<const uint4*>(head);
  else if constexpr (kB == 4)
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
// wait for each chunk's partials by their flags ([span][kv head]), which each span's warp (or
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

// Two ways to split the work (kByWarp, decode_by_warp): a block per (span, kv head), each warp
// a quarter of the span's keys, merged in warp order (many warps for a short context), or a
// warp per (span, kv head), 4 to a block, each warp writing (or folding) its partial itself: no
// merge, no barrier, which pays once the context gives every warp of the GPU a span. Either
// way the keys a warp takes depend on the span and the split alone. A warp per span may hold
// the fold (FoldSync). kEarly (recorded steps only): a warp whose span
// is not the call's last issues its first copies before pdl_wait(). Only q and the last span's
// new row come from the kernel before; everything older is done when a kernel launched early
// starts, the staged span table and positions included (a recorded step copies them before its
// first kernel).
template <DType K, DType V, int D, bool kByWarp, bool kEarly = false>
__global__ void __launch_bounds__(32 * kDtWarps, dt_blocks<D>())
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
  // The keys [j0, n) the query sees (none past its position or before its window: an empty
  // partial).
  const int n = min(sp.n, g.pos[0] - sp.start + 1);
  const int j0 = min(max(first_key(g, g.pos[0]) - sp.start, 0), max(n, 0));
  if (n - j0 <= 0) {
    if constexpr (kEarly) pdl_wait();
    const int t0 = kByWarp ? lane : threadIdx.x, nt = kByWarp ? 32 : blockDim.x;
    if (g.fold_in_place)
      fold_here(false, nullptr, nullptr, reinterpret_cast<float*>(kByWarp ? raw : dt_smem), t0, nt);
    else
      for (int r = t0; r < ng; r += nt) pout[r * stride + 2] = 0.0f;
    signal();
    return;
  }
  // This warp's keys: those the query sees (warp), or a quarter of them in whole tiles (block).
  int k_lo = j0, k_hi = n;
  if (!kByWarp) {
    const int per = ((n - j0 + kDtWarps - 1) / kDtWarps + kDtKeys - 1) / kDtKeys * kDtKeys;
    k_lo = min(n, j0 + warp * per), k_hi = min(n, k_lo + per);
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

}  // namespace

// f(D) for the call's head size (64, 128 or 256).
template <class F>
void dispatch_tc_head(int d, F&& f) {
  if (d == 64) return f.template operator()<64>();
  if (d == 128) return f.template operator()<128>();
  return f.template operator()<256>();
}

bool decode_tc_fits(const Ctx& c, const Geo& g, const KvLayout& l) {
  size_t smem = 0;
  dispatch_kv(l.k_type, [&]<DType K>() {
    dispatch_kv(l.v_type, [&]<DType V>() {
      dispatch_tc_head(g.d, [&]<int D>() {
        const HeadCopies hc = head_copies(g, l.n_head_kv);
        smem = kDtWarps *
               static_cast<size_t>(dt_warp_bytes(dt_stages<K, V, D>(), hc.kst, hc.vst, g.group, D));
      });
    });
  });
  return smem <= c.smem_optin;
}

bool launch_decode_tc(Ctx& c, Geo& g, const KvLayout& l, bool by_warp, float* part) {
  const int d = g.d;
  bool fold_launched = false;
  dispatch_kv(l.k_type, [&]<DType K>() {
    dispatch_kv(l.v_type, [&]<DType V>() {
      dispatch_tc_head(d, [&]<int D>() {
        const auto [kst, vst, cw] = head_copies(g, l.n_head_kv);
        const bool early = by_warp && c.staged;
        const auto tc = early     ? decode_tc<K, V, D, true, true>
                        : by_warp ? decode_tc<K, V, D, true>
                                  : decode_tc<K, V, D, false>;
        const int stages = dt_stages<K, V, D>();
        const size_t tc_smem =
            kDtWarps * static_cast<size_t>(dt_warp_bytes(stages, kst, vst, g.group, d));
        allow_smem(tc, tc_smem);
        // One span (a short context, or a ring chunk of one page): its block or warp folds it.
        g.fold_in_place = g.n_spans == 1;
        // (span, kv head): a warp or block each
        const int items = g.n_spans * l.n_head_kv;
        // The fold inside the launch when its warps fit a decode warp's shared memory and half
        // the blocks the GPU holds at once hold them twice over (its warps wait for the spans'
        // flags: the spans' blocks must always find room).
        FoldSync fs{};
        const int fold_blocks = (g.n_head * (d / 32) + kDtWarps - 1) / kDtWarps;
        if (by_warp && !g.fold_in_place &&
            dt_warp_bytes(stages, kst, vst, g.group, d) >= fold_bytes(32, kInlineFoldStages) &&
            2 * fold_blocks <= c.n_sm * resident(tc, 32 * kDtWarps, tc_smem)) {
          unsigned* buf = c.scratch_flags(2 + static_cast<size_t>(items));
          fs = {buf + 2, buf, fold_blocks};
          fold_launched = true;
        }
        launch(tc, dim3((by_warp ? (items + kDtWarps - 1) / kDtWarps : items) + fs.blocks),
               32 * kDtWarps, tc_smem, c.stream, g, part, l.n_head_kv, kst, vst, cw, fs);
      });
    });
  });
  return fold_launched;
}

bool decode_by_warp(const Ctx& c, const KvLayout& l, int64_t n_ctx) {
  if (c.decode_split != CudaOptions::DecodeSplit::Auto)
    return c.decode_split == CudaOptions::DecodeSplit::WarpPerSpan;
  // A warp per span once the context has a (span, kv head) pair for each warp of one block an
  // SM: below that a block's four warps on each span keep more of the GPU busy.
  const int64_t items = (n_ctx + l.page_size - 1) / l.page_size * l.n_head_kv;
  return items >= int64_t{kDtWarps} * c.n_sm;
}

#ifdef KVS_TRACE
KVS_TRACE_BIND(trace_bind_attention_decode_tc)
#endif

}  // namespace kvs::cuda
