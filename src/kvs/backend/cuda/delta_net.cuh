// The Gated DeltaNet kernels of delta_net.cu, in a header so that bench/gdn_bench.cu times
// each launch alone; its contents have internal linkage, a copy in each program that
// includes it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kvs/backend/cuda/common.cuh"
#include "kvs/backend/cuda/kernels.h"

namespace kvs::cuda {
namespace {

constexpr int kMaxTaps = 4;

struct Gdn {
  const float* conv;     // [n_tok][conv_dim]: silu of the conv, q and k not yet normalized
  const float* alpha;    // [n_tok][v_heads]
  const float* beta;     // [n_tok][v_heads], before the sigmoid
  const float* dt_bias;  // [v_heads]
  const float* a;        // [v_heads]
  float* y;              // [n_tok][v_heads][head]: o, which the norm's launch gates
  float* state;          // [v_heads][head][head]
  float* prep;           // [chunks][v_heads][Rec]: each chunk's record (prefill)
  int n_tok, k_heads, v_heads, chunk;
  float eps;
};

__device__ __forceinline__ float silu(float x) {
  return x / (1.0f + expf(-x));
}
__device__ __forceinline__ float softplus(float x) {
  return x > 20.0f ? x : log1pf(expf(x));
}
// Token t's decay (its log) and write strength at value head h, as the CPU computes them.
__device__ __forceinline__ float decay_log(const Gdn& g, int t, int h, float dt, float a) {
  return softplus(g.alpha[t * g.v_heads + h] + dt) * a;
}
__device__ __forceinline__ float strength(const Gdn& g, int t, int h) {
  return 1.0f / (1.0f + expf(-g.beta[t * g.v_heads + h]));
}

// n consecutive floats (16-byte aligned for 4, 8-byte for 2).
template <int N>
__device__ __forceinline__ void load(const float* p, float (&x)[N]) {
  if constexpr (N == 4) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
  } else if constexpr (N == 2) {
    const float2 v = *reinterpret_cast<const float2*>(p);
    x[0] = v.x, x[1] = v.y;
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = p[i];
  }
}
template <int N>
__device__ __forceinline__ void store(float* p, const float (&x)[N]) {
  if constexpr (N == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
  } else if constexpr (N == 2) {
    *reinterpret_cast<float2*>(p) = make_float2(x[0], x[1]);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = x[i];
  }
}

// A thread per channel c and kConvTok tokens from t0 = kConvTok blockIdx.y: out[t][c] =
// silu(sum_j window_j w[c][j]) over [tail; qkv]. The threads of the first tokens, the only ones
// that read the tail, move it on to the last K - 1 rows. The taps are weights, read before the
// wait.
constexpr int kConvTok = 16;
template <int K>
__global__ void __launch_bounds__(128)
    conv_k(const float* __restrict__ qkv, float* __restrict__ tail, const float* __restrict__ w,
           float* __restrict__ out, int n_tok, int C) {
  static_assert(kConvTok >= K - 1, "later tokens' windows begin past the tail");
  const int c = blockIdx.x * blockDim.x + threadIdx.x, t0 = blockIdx.y * kConvTok;
  float wk[K] = {};
  if (c < C)
#pragma unroll
    for (int j = 0; j < K; ++j) wk[j] = w[static_cast<size_t>(c) * K + j];
  pdl_wait();
  if (c >= C) return;
  // Row t of channel c: token t, or for t < 0 row K - 1 + t of the tail.
  const auto at = [&](int t) {
    return t < 0 ? tail[static_cast<size_t>(K - 1 + t) * C + c]
                 : qkv[static_cast<size_t>(t) * C + c];
  };
  float win[K - 1];  // the K - 1 rows before token t, oldest first
#pragma unroll
  for (int r = 0; r < K - 1; ++r) win[r] = at(t0 - (K - 1) + r);
  const int t1 = min(n_tok, t0 + kConvTok);
  for (int t = t0; t < t1; ++t) {
    const float x = qkv[static_cast<size_t>(t) * C + c];
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < K - 1; ++j) s += win[j] * wk[j];
    s += x * wk[K - 1];
    out[static_cast<size_t>(t) * C + c] = silu(s);
#pragma unroll
    for (int j = 0; j < K - 2; ++j) win[j] = win[j + 1];
    win[K - 2] = x;
  }
  if (blockIdx.y != 0) return;
  float next[K - 1];  // read whole before the old tail is written over
#pragma unroll
  for (int r = 0; r < K - 1; ++r) next[r] = at(n_tok - (K - 1) + r);
#pragma unroll
  for (int r = 0; r < K - 1; ++r) tail[static_cast<size_t>(r) * C + c] = next[r];
}

// Token by token: block (h, y) keeps rows [16 y, 16 y + 16) of value head h's state, a warp 4
// rows of them with lane l holding columns [l S / 32, (l + 1) S / 32); each warp normalizes
// the token's q and k itself (no block-wide wait). Per row, as the CPU: m *= e; d = beta (v -
// m . k); m += d k; o = m . q.
constexpr int kTokRows = 4, kTokWarps = 4;
template <int S>
__global__ void __launch_bounds__(32 * kTokWarps) tokens_k(const Gdn g) {
  constexpr int C = S / 32;
  const int h = blockIdx.x, lane = threadIdx.x % 32;
  const int row0 = (blockIdx.y * kTokWarps + threadIdx.x / 32) * kTokRows;
  const int kd = g.k_heads * S, conv_dim = 2 * kd + g.v_heads * S;
  const int qo = h % g.k_heads * S + lane * C;  // this lane's q in a conv row; its k at qo + kd
  const float dt = g.dt_bias[h], ra = g.a[h], q_scale = 1.0f / sqrtf(static_cast<float>(S));
  pdl_wait();
  float* M = g.state + (static_cast<size_t>(h) * S + row0) * S + lane * C;
  float m[kTokRows][C];
#pragma unroll
  for (int r = 0; r < kTokRows; ++r) load(M + r * S, m[r]);
  for (int t = 0; t < g.n_tok; ++t) {
    const float* row = g.conv + static_cast<size_t>(t) * conv_dim;
    float q[C], k[C], sq = 0.0f, sk = 0.0f;
    load(row + qo, q);
    load(row + kd + qo, k);
#pragma unroll
    for (int c = 0; c < C; ++c) sq += q[c] * q[c], sk += k[c] * k[c];
    const float fq = q_scale / sqrtf(warp_sum(sq) + g.eps);
    const float fk = 1.0f / sqrtf(warp_sum(sk) + g.eps);
#pragma unroll
    for (int c = 0; c < C; ++c) q[c] *= fq, k[c] *= fk;
    const float e = expf(decay_log(g, t, h, dt, ra)), beta = strength(g, t, h);
    const float* v = row + 2 * kd + h * S + row0;
    float* o = g.y + (static_cast<size_t>(t) * g.v_heads + h) * S + row0;
#pragma unroll
    for (int r = 0; r < kTokRows; ++r) {
      float d = 0.0f;
#pragma unroll
      for (int c = 0; c < C; ++c) m[r][c] *= e, d += m[r][c] * k[c];
      d = beta * (v[r] - warp_sum(d));
      float s = 0.0f;
#pragma unroll
      for (int c = 0; c < C; ++c) m[r][c] += d * k[c], s += m[r][c] * q[c];
      s = warp_sum(s);
      if (lane == r) o[r] = s;
    }
  }
#pragma unroll
  for (int r = 0; r < kTokRows; ++r) store(M + r * S, m[r]);
}

// Tensor-core products of the chunk kernel: m16n8k8 with tf32 inputs, f32 accumulators.
__device__ __forceinline__ uint32_t tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ void mma(float (&acc)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// acc[j] (16 x 8 tiles side by side, the mma's accumulator layout) += A[16 x kn] B[kn x 8 NB],
// by one warp, kn a multiple of 8, each A fragment loaded once for the NB tiles: A(m, k) at
// a[m * lda + k] (kAT: a[k * lda + m]); B(k, n) at b[n * ldb + k] (kBT: b[k * ldb + n]), row k
// of B scaled by bs[k] when bs is given. kSplit: each operand as the sum of two tf32 numbers,
// three products (near f32 precision; for Q K^T, whose rounding would otherwise dominate the
// chunk's error).
template <int NB, bool kAT, bool kBT, bool kSplit = false>
__device__ __forceinline__ void mma_strip(float (&acc)[NB][4], const float* a, int lda,
                                          const float* b, int ldb, int kn,
                                          const float* bs = nullptr) {
  const int lane = threadIdx.x % 32, gr = lane / 4, tg = lane % 4;
  const auto A = [&](int m, int k) { return kAT ? a[k * lda + m] : a[m * lda + k]; };
  const auto B = [&](int k, int n) {
    const float x = kBT ? b[k * ldb + n] : b[n * ldb + k];
    return bs ? x * bs[k] : x;
  };
  for (int k = 0; k < kn; k += 8) {
    const float af[4] = {A(gr, k + tg), A(gr + 8, k + tg), A(gr, k + tg + 4),
                         A(gr + 8, k + tg + 4)};
    uint32_t ah[4], al[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      ah[i] = tf32(af[i]);
      if constexpr (kSplit) al[i] = tf32(af[i] - __uint_as_float(ah[i]));
    }
#pragma unroll
    for (int j = 0; j < NB; ++j) {
      const float bf[2] = {B(k + tg, 8 * j + gr), B(k + tg + 4, 8 * j + gr)};
      const uint32_t bh[2] = {tf32(bf[0]), tf32(bf[1])};
      if constexpr (kSplit) {
        mma(acc[j], al, bh[0], bh[1]);
        mma(acc[j], ah, tf32(bf[0] - __uint_as_float(bh[0])), tf32(bf[1] - __uint_as_float(bh[1])));
      }
      mma(acc[j], ah, bh[0], bh[1]);
    }
  }
}

// A prefill's delta rule, a chunk of n <= 64 tokens from t0 at a time (rows past n zero), with
// G_t the decay's log summed over the chunk up to t and every exponent <= 0:
//   L[t][s] = beta_t e^(G_t - G_s) k_s . k_t (s < t), Lq[t][s] = e^(G_t - G_s) k_s . q_t (s <= t)
//   T = (I + L)^-1 (the CPU's forward substitution), U0 = T diag(beta) V,
//   W = T diag(beta e^G) K, Qe = diag(e^G) Q, Kd = diag(e^(G_last - G)) K
//   U = U0 - W M^T, O = Qe M^T + Lq U, M = e^G_last M + U^T Kd
// in two launches: intra_k computes what does not depend on the state (Lq, U0, W, Qe, Kd) for
// every chunk and value head at once into a record of each; slices_k then carries slices of
// kSlice value rows of each head's state through the chunks, the slices independent (a value
// row of M depends on its own value column of V only). Rows in shared memory are padded to keep
// each fragment load of a warp on 32 banks (a pitch of 4 mod 32 for rows read along k, 8 mod 32
// for rows read across).
constexpr int kChunk = 64, kChunkThreads = 256, kWarps = kChunkThreads / 32;
constexpr int kSlice = 32;
constexpr int LL = kChunk + 4;  // the pitch of L, Lq and T in shared memory

// Rows [t0, t0 + n) of q (scaled by 1/sqrt(S)) and k of key head kh, L2-normalized, into Qs and
// Ks (pitch ld), zeros up to 64; a warp a row, each warp's rows loaded kAhead at a time (their
// loads in flight together).
template <int S>
__device__ void load_qk(const Gdn& g, int t0, int n, int kh, float* Qs, float* Ks, int ld) {
  constexpr int C = S / 32, kAhead = 4;
  const int lane = threadIdx.x % 32, kd = g.k_heads * S, conv_dim = 2 * kd + g.v_heads * S;
  const float q_scale = 1.0f / sqrtf(static_cast<float>(S));
  for (int t1 = threadIdx.x / 32; t1 < kChunk; t1 += kAhead * kWarps) {
    float q[kAhead][C] = {}, k[kAhead][C] = {};
#pragma unroll
    for (int a = 0; a < kAhead; ++a) {
      const int t = t1 + a * kWarps;
      if (t < n) {
        const float* row = g.conv + static_cast<size_t>(t0 + t) * conv_dim + kh * S + lane * C;
        load(row, q[a]);
        load(row + kd, k[a]);
      }
    }
#pragma unroll
    for (int a = 0; a < kAhead; ++a) {
      const int t = t1 + a * kWarps;
      float sq = 0.0f, sk = 0.0f;
#pragma unroll
      for (int c = 0; c < C; ++c) sq += q[a][c] * q[a][c], sk += k[a][c] * k[a][c];
      sq = warp_sum(sq), sk = warp_sum(sk);
      // Rows past n stay zero (a zero eps would make their factor infinite).
      const float fq = t < n ? q_scale / sqrtf(sq + g.eps) : 0.0f;
      const float fk = t < n ? 1.0f / sqrtf(sk + g.eps) : 0.0f;
#pragma unroll
      for (int c = 0; c < C; ++c) q[a][c] *= fq, k[a][c] *= fk;
      store(Qs + t * ld + lane * C, q[a]);
      store(Ks + t * ld + lane * C, k[a]);
    }
  }
}

// G (the decay's log summed over the chunk, in token order as the CPU) and beta of tokens
// [t0, t0 + n) at value head h, zeros past n. Waits for the block twice.
__device__ void load_gates(const Gdn& g, int t0, int n, int h, float* G, float* B) {
  const int t = threadIdx.x;
  if (t < kChunk) {
    G[t] = t < n ? decay_log(g, t0 + t, h, g.dt_bias[h], g.a[h]) : 0.0f;
    B[t] = t < n ? strength(g, t0 + t, h) : 0.0f;
  }
  __syncthreads();
  if (t == 0) {
    float acc = 0.0f;
    for (int i = 0; i < kChunk; ++i) G[i] = acc += G[i];
  }
  __syncthreads();
}

// A record (floats, 16-byte aligned): Lq [64][64], W, U0, Qe and Kd [64][S] each, e^G_last.
template <int S>
struct Rec {
  static constexpr int lq = 0, w = lq + kChunk * kChunk, u0 = w + kChunk * S,
                       qe = u0 + kChunk * S, kd = qe + kChunk * S, el = kd + kChunk * S,
                       floats = el + 4;
};

// Shared memory (floats) of intra_k: K and Q (then V) rows, L, T, T's blocks' temporaries, G,
// beta and beta e^G (Lq goes from the accumulators to the record). Small enough for two blocks
// an SM on an H100.
template <int S>
struct IntraSmem {
  static constexpr int LK = S + 4;
  static constexpr int k = 0, q = k + kChunk * LK, l = q + kChunk * LK, ti = l + kChunk * LL,
                       tmp = ti + kChunk * LL, vec = tmp + 3 * 256, floats = vec + 3 * kChunk;
  static constexpr size_t bytes = sizeof(float) * floats;
};

// Of slices_k: W then Kd (its pitch 8 mod 32 for the update's reads across), Qe, Lq, U0 then
// U, the block's slice of the state, e^G_last. Small enough for two blocks an SM on an H100.
template <int S>
struct SliceSmem {
  static constexpr int LK = S + 4, LD = S + 8, LV = kSlice + 8;
  static constexpr int x = 0, qe = x + kChunk * LD, lq = qe + kChunk * LK, u = lq + kChunk * LL,
                       m = u + kChunk * LV, el = m + kSlice * LK, floats = el + 4;
  static constexpr size_t bytes = sizeof(float) * floats;
};

__device__ __forceinline__ void cp16(float* dst, const float* src) {
  const auto d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Until at most N of this thread's latest groups are in flight.
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// rows x cols floats (cols a multiple of 4) from src (pitch sp) to dst (pitch dp), by cp.async
// over the block.
__device__ __forceinline__ void cp_rows(float* dst, int dp, const float* src, int sp, int rows,
                                        int cols) {
  const int q = cols / 4;
  for (int e = threadIdx.x; e < rows * q; e += blockDim.x) {
    const int r = e / q, c = e % q * 4;
    cp16(dst + r * dp + c, src + static_cast<size_t>(r) * sp + c);
  }
}

// Chunk blockIdx.x (of g.chunk tokens) at value head blockIdx.y: its record to g.prep. L and
// Lq by warps in strips (Lq straight to the record), then Qe, Kd and e^G_last out, V in Q's
// place, T, and W and U0 by warps in strips of 16 rows.
template <int S>
__global__ void __launch_bounds__(kChunkThreads, 2) intra_k(const Gdn g) {
  using P = IntraSmem<S>;
  using R = Rec<S>;
  constexpr int LK = P::LK;
  constexpr int NB = S / 8 < 8 ? S / 8 : 8, NG = S / 8 / NB;  // tiles a strip, strips a row
  extern __shared__ __align__(16) float sm[];
  float *Ks = sm + P::k, *Qs = sm + P::q, *Ls = sm + P::l, *Ti = sm + P::ti, *Yt = sm + P::tmp;
  float *G = sm + P::vec, *B = G + kChunk, *BE = B + kChunk;
  float* Vs = Qs;
  const int h = blockIdx.y, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int gr = lane / 4, tg = lane % 4, n_c = min(g.chunk, kChunk), t0 = blockIdx.x * n_c;
  const int n = min(n_c, g.n_tok - t0);
  const int kd = g.k_heads * S, conv_dim = 2 * kd + g.v_heads * S;
  float* rec = g.prep + (static_cast<size_t>(blockIdx.x) * g.v_heads + h) * R::floats;
  // Above their diagonals L and T (adjacent) stay zero.
  for (int i = tid; i < 2 * kChunk * LL; i += kChunkThreads) Ls[i] = 0.0f;
  pdl_wait();
  load_qk<S>(g, t0, n, h % g.k_heads, Qs, Ks, LK);
  load_gates(g, t0, n, h, G, B);

  // L and Lq: the tiles on or below the diagonal, two side by side a job (row block r has r + 1
  // pairs), 10 jobs each.
  for (int job = warp; job < 20; job += kWarps) {
    const bool is_q = job >= 10;
    const int j = job % 10,
              r = j < 1   ? 0
                  : j < 3 ? 1
                  : j < 6 ? 2
                          : 3,
              c0 = 2 * (j - r * (r + 1) / 2);
    float acc[2][4] = {};
    if (is_q)
      mma_strip<2, false, false, true>(acc, Qs + 16 * r * LK, LK, Ks + 8 * c0 * LK, LK, S);
    else
      mma_strip<2, false, false>(acc, Ks + 16 * r * LK, LK, Ks + 8 * c0 * LK, LK, S);
#pragma unroll
    for (int jj = 0; jj < 2; ++jj)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int t = 16 * r + gr + 8 * half, s = 8 * (c0 + jj) + 2 * tg;
        float x[2];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const bool on = is_q ? s + u <= t : s + u < t;
          x[u] = on ? (is_q ? 1.0f : B[t]) * expf(G[t] - G[s + u]) * acc[jj][2 * half + u] : 0.0f;
        }
        if (is_q)
          store(rec + R::lq + t * kChunk + s, x);
        else
          store(Ls + t * LL + s, x);
      }
  }
  // Lq's 16 x 16 blocks above the diagonal, zeros.
  for (int e = tid; e < kChunk * kChunk / 4; e += kChunkThreads) {
    const int t = e / (kChunk / 4), c = e % (kChunk / 4) * 4;
    const float zero[4] = {};
    if (c / 16 > t / 16) store(rec + R::lq + t * kChunk + c, zero);
  }
  __syncthreads();

  const float gl = G[kChunk - 1];
  if (tid < kChunk) BE[tid] = B[tid] * expf(G[tid]);
  if (tid < 4) rec[R::el + tid] = tid == 0 ? expf(gl) : 0.0f;
  for (int e = tid; e < kChunk * S / 4; e += kChunkThreads) {
    const int t = e / (S / 4), c = e % (S / 4) * 4;
    const float fq = expf(G[t]), fk = expf(gl - G[t]);
    float x[4];
    load(Qs + t * LK + c, x);
#pragma unroll
    for (int u = 0; u < 4; ++u) x[u] *= fq;
    store(rec + R::qe + t * S + c, x);
    load(Ks + t * LK + c, x);
#pragma unroll
    for (int u = 0; u < 4; ++u) x[u] *= fk;
    store(rec + R::kd + t * S + c, x);
  }
  __syncthreads();  // Q read whole before V takes its place
  // V's rows, all of a thread's loads in flight together.
  {
    constexpr int kPer = kChunk * S / 4 / kChunkThreads;
    float x[kPer][4] = {};
#pragma unroll
    for (int a = 0; a < kPer; ++a) {
      const int e = tid + a * kChunkThreads, t = e / (S / 4), c = e % (S / 4) * 4;
      if (t < n) load(g.conv + static_cast<size_t>(t0 + t) * conv_dim + 2 * kd + h * S + c, x[a]);
    }
#pragma unroll
    for (int a = 0; a < kPer; ++a) {
      const int e = tid + a * kChunkThreads, t = e / (S / 4), c = e % (S / 4) * 4;
      store(Vs + t * LK + c, x[a]);
    }
  }

  // T = (I + L)^-1 by 16 x 16 blocks: the diagonal ones by forward substitution (a thread per
  // column; each sum over all 16 columns, the terms outside [c, t) zeros of L or of T, for fixed
  // loop bounds), then T_ij = -T_ii sum_{j <= b < i} L_ib T_bj for i - j = 1, 2, 3.
  if (tid < kChunk) {
    const int o = tid / 16 * 16, c = tid % 16;
#pragma unroll
    for (int t = 0; t < 16; ++t) {
      float s = 0.0f;
#pragma unroll
      for (int u = 0; u < 16; ++u) s += Ls[(o + t) * LL + o + u] * Ti[(o + u) * LL + o + c];
      Ti[(o + t) * LL + o + c] = t < c ? 0.0f : t == c ? 1.0f : -s;
    }
  }
  __syncthreads();
#pragma unroll
  for (int d = 1; d < 4; ++d) {
    const int n_el = (4 - d) * 256;
    for (int e = tid; e < n_el; e += kChunkThreads) {
      const int i = d + e / 256, j = i - d, rr = e % 256 / 16, cc = e % 16;
      float s = 0.0f;
#pragma unroll 16
      for (int u = 16 * j; u < 16 * i; ++u)
        s += Ls[(16 * i + rr) * LL + u] * Ti[u * LL + 16 * j + cc];
      Yt[e] = s;
    }
    __syncthreads();
    for (int e = tid; e < n_el; e += kChunkThreads) {
      const int i = d + e / 256, j = i - d, rr = e % 256 / 16, cc = e % 16;
      float s = 0.0f;
      for (int u = 0; u < 16; ++u)
        s += Ti[(16 * i + rr) * LL + 16 * i + u] * Yt[e / 256 * 256 + u * 16 + cc];
      Ti[(16 * i + rr) * LL + 16 * j + cc] = -s;
    }
    __syncthreads();
  }

  // W = T diag(beta e^G) K and U0 = T diag(beta) V (T lower triangular: row block r needs
  // columns below 16 (r + 1) only), straight from the accumulators.
  for (int job = warp; job < 2 * 4 * NG; job += kWarps) {
    const bool is_u = job >= 4 * NG;
    const int r = job % (4 * NG) / NG, c0 = job % NG * NB;
    float acc[NB][4] = {};
    mma_strip<NB, false, true>(acc, Ti + 16 * r * LL, LL, (is_u ? Vs : Ks) + 8 * c0, LK,
                               16 * (r + 1), is_u ? B : BE);
    float* out = rec + (is_u ? R::u0 : R::w);
#pragma unroll
    for (int j = 0; j < NB; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float x[2] = {acc[j][2 * half], acc[j][2 * half + 1]};
        store(out + (16 * r + gr + 8 * half) * S + 8 * (c0 + j) + 2 * tg, x);
      }
  }
}

// Block (slice, h) carries value rows [kSlice slice, kSlice slice + kSlice) of head h's state
// through the chunks in shared memory. Each buffer's next contents come by cp.async as soon as
// its last reader is past: Kd and the next Qe while O's second term is computed, the next W,
// U0 and Lq after the update.
template <int S>
__global__ void __launch_bounds__(kChunkThreads, 2) slices_k(const Gdn g) {
  using L = SliceSmem<S>;
  using R = Rec<S>;
  constexpr int SV = kSlice, LK = L::LK, LD = L::LD, LV = L::LV;
  constexpr int NR = SV / 16;             // tiles a warp's strip of a [64 x SV] product
  constexpr int WM = kWarps / (SV / 16);  // warps a row block of the state's [SV x S] update
  constexpr int NM = S / 8 / WM;          // and the tiles of each warp's strip there
  extern __shared__ __align__(16) float sm[];
  float *X = sm + L::x, *Qe = sm + L::qe, *Lq = sm + L::lq, *Us = sm + L::u, *Ms = sm + L::m;
  const float* El = sm + L::el;
  const int i0 = blockIdx.x * SV, h = blockIdx.y, tid = threadIdx.x, warp = tid / 32;
  const int lane = tid % 32, gr = lane / 4, tg = lane % 4;
  const int n_c = min(g.chunk, kChunk), chunks = (g.n_tok + n_c - 1) / n_c;
  const auto rec = [&](int ci) {
    return g.prep + (static_cast<size_t>(ci) * g.v_heads + h) * R::floats;
  };
  const auto fetch = [&](int ci) {  // W, U0's slice, Lq and e^G_last of chunk ci
    const float* r = rec(ci);
    cp_rows(X, LK, r + R::w, S, kChunk, S);
    cp_rows(Us, LV, r + R::u0 + i0, S, kChunk, SV);
    cp_rows(Lq, LL, r + R::lq, kChunk, kChunk, kChunk);
    if (tid == 0) cp16(sm + L::el, r + R::el);
  };
  pdl_wait();
  fetch(0);
  cp_rows(Qe, LK, rec(0) + R::qe, S, kChunk, S);
  cp_commit();
  float* Mg = g.state + (static_cast<size_t>(h) * S + i0) * S;
  for (int e = tid; e < SV * S / 4; e += kChunkThreads) {
    const int i = e / (S / 4), j = e % (S / 4) * 4;
    *reinterpret_cast<float4*>(Ms + i * LK + j) = *reinterpret_cast<const float4*>(Mg + i * S + j);
  }
  // The [64 x SV] products: warp w takes row block w / 2, tiles (w % 2) NR on.
  const int r = warp / 2, c0 = warp % 2 * NR;
  for (int ci = 0; ci < chunks; ++ci) {
    const int t0 = ci * n_c, n = min(n_c, g.n_tok - t0);
    cp_wait<0>();
    __syncthreads();
    // U = U0 - W M^T in place of U0 (the accumulator from -U0, negated after), and O's first
    // term Qe M^T.
    float o[NR][4] = {};
    {
      float acc[NR][4];
#pragma unroll
      for (int j = 0; j < NR; ++j)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float x[2];
          load(Us + (16 * r + gr + 8 * half) * LV + 8 * (c0 + j) + 2 * tg, x);
          acc[j][2 * half] = -x[0], acc[j][2 * half + 1] = -x[1];
        }
      mma_strip<NR, false, false>(acc, X + 16 * r * LK, LK, Ms + 8 * c0 * LK, LK, S);
      mma_strip<NR, false, false>(o, Qe + 16 * r * LK, LK, Ms + 8 * c0 * LK, LK, S);
#pragma unroll
      for (int j = 0; j < NR; ++j)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const float x[2] = {-acc[j][2 * half], -acc[j][2 * half + 1]};
          store(Us + (16 * r + gr + 8 * half) * LV + 8 * (c0 + j) + 2 * tg, x);
        }
    }
    __syncthreads();  // U whole; W and Qe read
    cp_rows(X, LD, rec(ci) + R::kd, S, kChunk, S);
    cp_commit();
    if (ci + 1 < chunks) cp_rows(Qe, LK, rec(ci + 1) + R::qe, S, kChunk, S);
    cp_commit();
    // O += Lq U, the chunk's n rows to y.
    mma_strip<NR, false, true>(o, Lq + 16 * r * LL, LL, Us + 8 * c0, LV, 16 * (r + 1));
#pragma unroll
    for (int j = 0; j < NR; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int t = 16 * r + gr + 8 * half;
        const float x[2] = {o[j][2 * half], o[j][2 * half + 1]};
        if (t < n)
          store(g.y + (static_cast<size_t>(t0 + t) * g.v_heads + h) * S + i0 + 8 * (c0 + j) +
                    2 * tg,
                x);
      }
    cp_wait<1>();
    __syncthreads();  // Kd here
    // M = e^G_last M + U^T Kd, each strip in place by the warp that owns it.
    {
      const int rm = warp / WM, cm = warp % WM * NM;
      const float el = El[0];
      float acc[NM][4];
#pragma unroll
      for (int j = 0; j < NM; ++j)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float x[2];
          load(Ms + (16 * rm + gr + 8 * half) * LK + 8 * (cm + j) + 2 * tg, x);
          acc[j][2 * half] = x[0] * el, acc[j][2 * half + 1] = x[1] * el;
        }
      mma_strip<NM, true, true>(acc, Us + 16 * rm, LV, X + 8 * cm, LD, kChunk);
#pragma unroll
      for (int j = 0; j < NM; ++j)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const float x[2] = {acc[j][2 * half], acc[j][2 * half + 1]};
          store(Ms + (16 * rm + gr + 8 * half) * LK + 8 * (cm + j) + 2 * tg, x);
        }
    }
    __syncthreads();  // Kd, U, Lq and e^G_last read
    if (ci + 1 < chunks) fetch(ci + 1);
    cp_commit();
  }
  cp_wait<0>();
  __syncthreads();
  for (int e = tid; e < SV * S / 4; e += kChunkThreads) {
    const int i = e / (S / 4), j = e % (S / 4) * 4;
    *reinterpret_cast<float4*>(Mg + i * S + j) = *reinterpret_cast<const float4*>(Ms + i * LK + j);
  }
}

// y = rmsnorm(o) * w * silu(z), a warp per (token, value head) row of S; w read before the wait.
template <int S>
__global__ void __launch_bounds__(128) norm_k(float* __restrict__ y, const float* __restrict__ z,
                                              const float* __restrict__ w, int rows, float eps) {
  constexpr int C = S / 32;
  const int r = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
  float wv[C];
  load(w + lane * C, wv);
  pdl_wait();
  if (r >= rows) return;
  float* yr = y + static_cast<size_t>(r) * S + lane * C;
  float v[C], zv[C], ss = 0.0f;
  load(yr, v);
  load(z + static_cast<size_t>(r) * S + lane * C, zv);
#pragma unroll
  for (int c = 0; c < C; ++c) ss += v[c] * v[c];
  const float s = 1.0f / sqrtf(warp_sum(ss) / static_cast<float>(S) + eps);
#pragma unroll
  for (int c = 0; c < C; ++c) v[c] = v[c] * s * wv[c] * silu(zv[c]);
  store(yr, v);
}

template <class F>
void dispatch_head(int head, F&& f) {
  switch (head) {
    case 32:
      return f.template operator()<32>();
    case 64:
      return f.template operator()<64>();
    case 128:
      return f.template operator()<128>();
    default:
      fail("cuda: Gated DeltaNet heads of ", head, " (32, 64 or 128)");
  }
}

template <class F>
void dispatch_taps(int taps, F&& f) {
  switch (taps) {
    case 2:
      return f.template operator()<2>();
    case 3:
      return f.template operator()<3>();
    case 4:
      return f.template operator()<4>();
    default:
      fail("cuda: Gated DeltaNet conv of ", taps, " taps (2 to ", kMaxTaps, ")");
  }
}

}  // namespace
}  // namespace kvs::cuda
