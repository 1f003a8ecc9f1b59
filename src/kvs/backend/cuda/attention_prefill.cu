// Prefill attention: blocks of query rows (query, head) of one kv head walk the spans in tiles
// with an online softmax over tiles (prefill_tc on tensor cores over f16 tiles, a quantized
// cache converted to f16 first; prefill on CUDA cores for heads of 32, and of 256 where a
// block's shared memory cannot hold prefill_tc's tiles); a tile never crosses a span, so the
// sequence of operations does not depend on how the spans were split into calls.
#include <algorithm>
#include <climits>

#include "kvs/backend/cuda/attention_tile.cuh"

namespace kvs::cuda {
namespace {

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

// Prefill tiles: kTQ queries x the group's heads as rows, kTK keys per tile.
constexpr int kPreThreads = 128;
constexpr int kTK = 32;

template <int D>
struct Tile {
  // Query rows (query, head) per block. Heads of 256 take 16: their tile's 91 KiB of shared
  // memory fit the 99 KiB a block may have on the consumer cards (sm_86, sm_89, sm_120), which
  // 32 rows (110 KiB) would not.
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
  int min_pos = INT_MAX;
  for (int t = t0; t < min(t0 + tq, g.n_tok); ++t)
    max_pos = max(max_pos, g.pos[t]), min_pos = min(min_pos, g.pos[t]);
  const int fk = first_key(g, min_pos);  // keys before it are before every row's window
  const unsigned reach = g.window > 0 ? g.window : INT_MAX;  // keys a row sees, its own last
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
    if (sp.start + n_span <= fk) continue;
    // Tiles before every window are skipped: their rows' softmax steps would change nothing.
    for (int k0 = max(0, fk - sp.start) / kTK * kTK; k0 < n_span; k0 += kTK) {
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
          const int key = key0 + j, kp = sp.start + k0 + key;
          // rp[r] - window < kp <= rp[r] in one unsigned comparison (a key past the row wraps)
          const bool live = key < nk && static_cast<unsigned>(rp[r] - kp) < reach;
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

// Prefill on tensor cores, for head sizes 64, 128 and 256, on f16 K and V (a quantized cache is
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

// The online softmax of one prefill tile on mma accumulators: sc[nt][e] is the (masked,
// scaled) score of row gr + 8 (e / 2) and key 8 nt + 2 t4 + e % 2, each row spread over the 4
// threads of a quad. Scores become probabilities against the new running max m; l is updated
// and o, the unnormalised output of the rows ([D / 8][4], the same row split), is rescaled.
// Scores and maxima are in units of log2 (the scale times log2(e) was folded into Q), so each
// probability is one ex2 instruction, where expf takes several.
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
  int max_pos = -1, min_pos = INT_MAX;
  for (int t = t0; t < min(t0 + tq, g.n_tok); ++t)
    max_pos = max(max_pos, g.pos[t]), min_pos = min(min_pos, g.pos[t]);
  // The first key each row sees, and the first any row of the block sees.
  const int fkr[2] = {first_key(g, rpos[0]), first_key(g, rpos[1])}, fk = first_key(g, min_pos);

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
  // position) and its first tile that holds a key after fk (the tiles before it would change
  // nothing). Spans are read once each, the next one ahead of its first tile.
  struct SpanAt {
    const uint8_t* page;
    int start, len, lo;
  };
  const auto span_at = [&](int s) {
    if (s >= g.n_spans) return SpanAt{nullptr, 0, 0, 0};
    const Span sp = g.spans[s];
    return SpanAt{sp.page, sp.start, sp.start > max_pos ? 0 : min(sp.n, max_pos - sp.start + 1),
                  max(0, fk - sp.start) / kTcKeys * kTcKeys};
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

  int s_cur = 0;  // the tile's span: the first not wholly before fk
  while (s_cur < g.n_spans && g.spans[s_cur].start + g.spans[s_cur].n <= fk) ++s_cur;
  SpanAt a = span_at(s_cur), b = span_at(s_cur + 1);  // its span and the next
  int k_cur = a.lo;                                   // the tile
  bool have = a.len > 0;
  int buf = 0;
  if (have) issue(a, k_cur, 0);
  cp_commit();
  while (have) {
    // The next tile: further into this span, or the next span's first.
    const bool cross = k_cur + kTcKeys >= a.len;
    const int k_nxt = cross ? b.lo : k_cur + kTcKeys;
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
    // Masks where the tile is not whole, reaches past a row's position or begins before its
    // window (most tiles do none of these).
    if (nk < kTcKeys || key_pos + kTcKeys - 1 > min(rpos[0], rpos[1]) ||
        key_pos < max(fkr[0], fkr[1]))
#pragma unroll
      for (int nt = 0; nt < kTcKeys / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = e / 2, key = 8 * nt + 2 * t4 + e % 2;
          if (key >= nk || key_pos + key > rpos[i] || key_pos + key < fkr[i]) sc[nt][e] = -INFINITY;
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

template <int D>
constexpr size_t prefill_tc_smem() {
  return sizeof(__half) * 4 * kTcKeys * (D + 8);
}

template <int D>
void launch_prefill_tc(Ctx& c, const Geo& g, int n_kv) {
  constexpr size_t smem = prefill_tc_smem<D>();
  allow_smem(prefill_tc<D>, smem);
  const int tq = kTcRows / g.group;
  launch(prefill_tc<D>, dim3((g.n_tok + tq - 1) / tq, n_kv), kTcThreads, smem, c.stream, g);
}

// On tensor cores: an f16 cache as it is, a quantized one converted to f16 in chunks.
template <DType K, DType V, int D>
void launch_prefill_f16(Ctx& c, const Geo& g, const KvLayout& l) {
  const int n_kv = l.n_head_kv;
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
}

template <DType K, DType V, int D>
void launch_prefill(Ctx& c, const Geo& g, const KvLayout& l) {
  if constexpr (D != 32) {
    // Heads of 256 where a block may hold their 132 KiB of tiles (not the consumer cards' 99).
    if (D != 256 || prefill_tc_smem<D>() <= c.smem_optin)
      return launch_prefill_f16<K, V, D>(c, g, l);
  }
  using T = Tile<D>;
  allow_smem(prefill<K, V, D>, T::kSmem);
  const int tq = T::kRows / g.group;
  launch(prefill<K, V, D>, dim3((g.n_tok + tq - 1) / tq, l.n_head_kv), kPreThreads, T::kSmem,
         c.stream, g);
}

}  // namespace

void attention_prefill(Ctx& c, const Geo& g, const KvLayout& l) {
  dispatch_kv(l.k_type, [&]<DType K>() {
    dispatch_kv(l.v_type, [&]<DType V>() {
      switch (l.head_dim) {
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
KVS_TRACE_BIND(trace_bind_attention_prefill)
#endif

}  // namespace kvs::cuda
