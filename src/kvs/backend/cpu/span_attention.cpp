#include "kvs/backend/cpu/span_attention.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "kvs/quant/simd.h"
#include "kvs/util/error.h"

namespace kvs::cpu {
namespace {

using quant::hsum;

// ---- dot products of int16 pairs: acc + a0 b0 + a1 b1 in every int32 lane ----

struct Avx2 {
  static __m256i dot(__m256i acc, __m256i a, __m256i b) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
  }
};
struct AvxVnni {
  [[gnu::target("avxvnni")]] static __m256i dot(__m256i acc, __m256i a, __m256i b) {
    return _mm256_dpwssd_avx_epi32(acc, a, b);
  }
};
struct Avx512Vnni {
  [[gnu::target("avx512vnni,avx512vl")]] static __m256i dot(__m256i acc, __m256i a, __m256i b) {
    return _mm256_dpwssd_epi32(acc, a, b);
  }
};

inline __m256i load256(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

// Lane i = the sum of v[i]'s 8 lanes, ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)) for each: a
// lane's value depends on its own vector only.
inline __m256 lane_sums(const __m256* v) {
  const __m256 a = _mm256_hadd_ps(v[0], v[1]), b = _mm256_hadd_ps(v[2], v[3]);
  const __m256 c = _mm256_hadd_ps(v[4], v[5]), e = _mm256_hadd_ps(v[6], v[7]);
  const __m256 ab = _mm256_hadd_ps(a, b), ce = _mm256_hadd_ps(c, e);
  return _mm256_add_ps(_mm256_permute2f128_ps(ab, ce, 0x20), _mm256_permute2f128_ps(ab, ce, 0x31));
}

// ---- scores ----

// acc[kk * S + g] = the 8 lanes of head g's sum against key kk's K slice (at k + kk k_row, d
// values), kk < KN, S = score_slots(G): f32 products of q for f16 keys; for quantized keys, per
// block of 32 the exact integer sum of q16 x levels in each lane (4 products), converted and scaled
// by the key block's scale times q's step. The keys' chains are interleaved, each its own.
template <class I, DType K, int G, int KN, int S = score_slots(G)>
[[gnu::always_inline]] inline void key_sums(const float* q, const int16_t* q16, const float* step,
                                            const int32_t* offset, int32_t d, const uint8_t* k,
                                            size_t k_row, __m256 (&acc)[8]) {
  for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
  if constexpr (K == DType::F16) {
    for (int32_t i = 0; i < d; i += 8)
      for (int kk = 0; kk < KN; ++kk) {
        const __m256 kv = _mm256_cvtph_ps(quant::load16(k + kk * k_row + 2 * i));
        for (int g = 0; g < G; ++g)
          acc[kk * S + g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * d + i), kv, acc[kk * S + g]);
      }
  } else {
    const int32_t nb = d / 32, sb = query_blocks(d);
    // sc[kk][g][b]: key kk's scale of block b times head g's step there. The scales are read 8
    // at a time from the slice's start (within it: it holds 34 or 18 bytes a block); lanes past
    // nb are not used.
    alignas(32) float sc[KN][G][16];
    for (int kk = 0; kk < KN; ++kk)
      for (int32_t b = 0; b < nb; b += 8) {
        const __m256 dk = _mm256_cvtph_ps(quant::load16(k + kk * k_row + 2 * b));
        for (int g = 0; g < G; ++g)
          _mm256_store_ps(sc[kk][g] + b, _mm256_mul_ps(dk, _mm256_loadu_ps(step + g * sb + b)));
      }
    for (int32_t b = 0; b < nb; ++b)
      for (int kk = 0; kk < KN; ++kk) {
        const uint8_t* qs = k + kk * k_row + 2 * nb;
        // Elements 0-15 and 16-31 of the block: q8_0 levels; q4_0 nibbles (levels + 8), the
        // sums starting from offset (-8 x q16's sums in each lane) instead of zero.
        __m256i k0, k1;
        if constexpr (K == DType::Q8_0) {
          k0 = _mm256_cvtepi8_epi16(quant::load16(qs + 32 * b));
          k1 = _mm256_cvtepi8_epi16(quant::load16(qs + 32 * b + 16));
        } else {
          const __m256i bytes = _mm256_cvtepu8_epi16(quant::load16(qs + 16 * b));
          k0 = _mm256_and_si256(bytes, _mm256_set1_epi16(0x0F));
          k1 = _mm256_srli_epi16(bytes, 4);
        }
        for (int g = 0; g < G; ++g) {
          const int16_t* qb = q16 + g * d + 32 * b;
          // (q8_0: the first products by vpmaddwd, which needs no zeroed accumulator.)
          const __m256i first = K == DType::Q4_0
                                    ? I::dot(load256(offset + (g * nb + b) * 8), k0, load256(qb))
                                    : _mm256_madd_epi16(k0, load256(qb));
          const __m256i s = I::dot(first, k1, load256(qb + 16));
          acc[kk * S + g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s),
                                            _mm256_broadcast_ss(sc[kk][g] + b), acc[kk * S + g]);
        }
      }
  }
}

#ifndef __clang__
#define KVS_HAVE_ZMM_SCORES 1
// AVX-512: two heads of the group in one vector, head 2p in the low 8 lanes and 2p + 1 in the
// high ones, against the key block repeated in both halves. Each lane gets the integer sum and
// the float steps of key_sums' lane (the same products, the same scale, one FMA a block), so the
// bits are key_sums'; a block takes half the instructions. The query side, laid out per pair
// once a call (Pairs::make): q16's halves of a block, the q4_0 offsets and the steps, each
// repeated over the 8 lanes of its head.
constexpr int kMaxBlocks = 512 / 32;
struct Pairs {
  alignas(64) int16_t q[4][kMaxBlocks][2][32];
  alignas(64) int32_t offset[4][kMaxBlocks][16];
  alignas(64) float step[4][kMaxBlocks][16];

  void make(const int16_t* q16, const float* st, const int32_t* off, int32_t d, int n_pairs) {
    const int32_t nb = d / 32, sb = query_blocks(d);
    for (int pr = 0; pr < n_pairs; ++pr)
      for (int32_t b = 0; b < nb; ++b)
        for (int hi = 0; hi < 2; ++hi) {
          const int g = 2 * pr + hi;
          for (int half = 0; half < 2; ++half)
            std::memcpy(q[pr][b][half] + 16 * hi, q16 + g * d + 32 * b + 16 * half, 32);
          if (off) std::memcpy(offset[pr][b] + 8 * hi, off + (g * nb + b) * 8, 32);
          for (int l = 0; l < 8; ++l) step[pr][b][8 * hi + l] = st[g * sb + b];
        }
  }
};

// key_sums for quantized keys with the pairs in 512-bit vectors; an odd group's last head takes
// key_sums' 256-bit steps.
template <DType K, int G, int KN, int S = score_slots(G)>
[[gnu::target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")]] inline void
key_sums_zmm(const Pairs& pq, const int16_t* q16, const float* step, const int32_t* offset,
             int32_t d, const uint8_t* k, size_t k_row, __m256 (&acc)[8]) {
  constexpr int NP = G / 2;
  const int32_t nb = d / 32, sb = query_blocks(d);
  __m512 za[KN][NP > 0 ? NP : 1];
  for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
  for (int kk = 0; kk < KN; ++kk)
    for (int pr = 0; pr < NP; ++pr) za[kk][pr] = _mm512_setzero_ps();
  alignas(64) float dk[KN][kMaxBlocks];
  for (int kk = 0; kk < KN; ++kk)
    for (int32_t b = 0; b < nb; b += 8)
      _mm256_store_ps(dk[kk] + b, _mm256_cvtph_ps(quant::load16(k + kk * k_row + 2 * b)));
  for (int32_t b = 0; b < nb; ++b)
    for (int kk = 0; kk < KN; ++kk) {
      const uint8_t* qs = k + kk * k_row + 2 * nb;
      __m512i k0, k1;
      if constexpr (K == DType::Q8_0) {
        k0 = _mm512_cvtepi8_epi16(_mm256_broadcastsi128_si256(quant::load16(qs + 32 * b)));
        k1 = _mm512_cvtepi8_epi16(_mm256_broadcastsi128_si256(quant::load16(qs + 32 * b + 16)));
      } else {
        const __m512i bytes =
            _mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(quant::load16(qs + 16 * b)));
        k0 = _mm512_and_si512(bytes, _mm512_set1_epi16(0x0F));
        k1 = _mm512_srli_epi16(bytes, 4);
      }
      const __m512 dkb = _mm512_set1_ps(dk[kk][b]);
      for (int pr = 0; pr < NP; ++pr) {
        const __m512i q0 = _mm512_load_si512(pq.q[pr][b][0]);
        const __m512i q1 = _mm512_load_si512(pq.q[pr][b][1]);
        const __m512i first = K == DType::Q4_0
                                  ? _mm512_dpwssd_epi32(_mm512_load_si512(pq.offset[pr][b]), k0, q0)
                                  : _mm512_madd_epi16(k0, q0);
        const __m512i sum = _mm512_dpwssd_epi32(first, k1, q1);
        const __m512 sc = _mm512_mul_ps(dkb, _mm512_load_ps(pq.step[pr][b]));
        za[kk][pr] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), sc, za[kk][pr]);
      }
      if constexpr (G % 2 == 1) {
        const int g = G - 1;
        const __m256i k0y = _mm512_castsi512_si256(k0), k1y = _mm512_castsi512_si256(k1);
        const int16_t* qb = q16 + g * d + 32 * b;
        const __m256i first =
            K == DType::Q4_0
                ? Avx512Vnni::dot(load256(offset + (g * nb + b) * 8), k0y, load256(qb))
                : _mm256_madd_epi16(k0y, load256(qb));
        const __m256i sum = Avx512Vnni::dot(first, k1y, load256(qb + 16));
        const __m256 sc = _mm256_mul_ps(_mm256_set1_ps(dk[kk][b]), _mm256_set1_ps(step[g * sb + b]));
        acc[kk * S + g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), sc, acc[kk * S + g]);
      }
    }
  for (int kk = 0; kk < KN; ++kk)
    for (int pr = 0; pr < NP; ++pr) {
      acc[kk * S + 2 * pr] = _mm512_castps512_ps256(za[kk][pr]);
      acc[kk * S + 2 * pr + 1] = _mm512_extractf32x8_ps(za[kk][pr], 1);
    }
}
#endif

// p[(j + kk) S + g] for KN keys from j, S = score_slots(G): their lane sums by one lane_sums
// (KN S <= 8; the other vectors zero), times the scale, as one vector of 8 (whatever it writes
// past the KN keys' slots is the next keys', or p's slack).
template <class I, DType K, int G, int KN>
[[gnu::always_inline]] inline void keys(const float* q, const int16_t* q16, const float* step,
                                        const int32_t* offset, float scale, int32_t d,
                                        const uint8_t* k, size_t k_row, int32_t j, float* p) {
  __m256 acc[8];
  key_sums<I, K, G, KN>(q, q16, step, offset, d, k + j * k_row, k_row, acc);
  _mm256_storeu_ps(p + j * score_slots(G), _mm256_mul_ps(lane_sums(acc), _mm256_set1_ps(scale)));
}
#ifdef KVS_HAVE_ZMM_SCORES
// keys() by key_sums_zmm.
template <DType K, int G, int KN>
[[gnu::always_inline]] inline void keys_zmm(const Pairs& pq, const int16_t* q16, const float* step,
                                            const int32_t* offset, float scale, int32_t d,
                                            const uint8_t* k, size_t k_row, int32_t j, float* p) {
  __m256 acc[8];
  key_sums_zmm<K, G, KN>(pq, q16, step, offset, d, k + j * k_row, k_row, acc);
  _mm256_storeu_ps(p + j * score_slots(G), _mm256_mul_ps(lane_sums(acc), _mm256_set1_ps(scale)));
}
#endif

// Lines of [p, p + bytes) into L2 (L1 does not keep a piece's rows of every head until their
// turn). A span's rows of one kv head are slices a row apart, which the hardware's
// prefetchers follow poorly.
inline void prefetch(const uint8_t* p, size_t bytes) {
  const auto first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
  for (uintptr_t a = first; a < reinterpret_cast<uintptr_t>(p) + bytes; a += 64)
    _mm_prefetch(reinterpret_cast<const char*>(a), _MM_HINT_T1);
}
constexpr int32_t kAhead = 16;  // K rows prefetched ahead of the one being read

// Scores of G heads against rows [0, r.n), 8 / score_slots(G) keys a step, the rest one by one
// (a key's score does not depend on the others of its step). Meanwhile the K rows ahead and the V
// rows of the same keys (read right after the softmax) come into the caches.
template <class I, DType K, int G>
void scores(const Query& qy, int32_t h0, float scale, int32_t d, const HeadRows& r, float* p) {
#ifdef KVS_HAVE_ZMM_SCORES
  constexpr bool zmm = std::is_same_v<I, Avx512Vnni> && K != DType::F16 && G >= 2;
#else
  [[maybe_unused]] constexpr bool zmm = false;
#endif
  constexpr int kn = 8 / score_slots(G);  // keys a step: a vector of 8 slots
  // The group's heads: for quantized keys q16, its steps and (q4_0) offsets.
  const float* q = qy.q + int64_t{h0} * d;
  const int16_t* q16 = K == DType::F16 ? nullptr : qy.q16 + int64_t{h0} * d;
  const float* step = K == DType::F16 ? nullptr : qy.step + int64_t{h0} * query_blocks(d);
  const int32_t* offset = K == DType::Q4_0 ? qy.offset + int64_t{h0} * d / 4 : nullptr;
  const size_t k_bytes = row_bytes(K, d);
#ifdef KVS_HAVE_ZMM_SCORES
  Pairs pq;
  if constexpr (zmm) pq.make(q16, step, offset, d, G / 2);
#endif
  const auto ahead = [&](int32_t j) {
    for (int32_t i = j; i < j + kn; ++i) {
      if (i + kAhead < r.n + r.more)
        prefetch(r.k + static_cast<size_t>(i + kAhead) * r.k_row, k_bytes);
      if (i < r.n) prefetch(r.v + static_cast<size_t>(i) * r.v_row, r.v_head);
    }
  };
  const auto step_of = [&]<int n>(int32_t j) {
#ifdef KVS_HAVE_ZMM_SCORES
    if constexpr (zmm) return keys_zmm<K, G, n>(pq, q16, step, offset, scale, d, r.k, r.k_row, j, p);
#endif
    keys<I, K, G, n>(q, q16, step, offset, scale, d, r.k, r.k_row, j, p);
  };
  int32_t j = 0;
  for (; j + kn <= r.n; j += kn) {
    ahead(j);
    step_of.template operator()<kn>(j);
  }
  for (; j < r.n; ++j) {
    ahead(j);
    step_of.template operator()<1>(j);
  }
}

// One entry per instruction set, the kernel inlined into it, compiled for it.
template <DType K, int G>
void scores_avx2(const Query& q, int32_t h0, float scale, int32_t d, const HeadRows& r, float* p) {
  scores<Avx2, K, G>(q, h0, scale, d, r, p);
}
template <DType K, int G>
[[gnu::target("avxvnni"), gnu::flatten]] void scores_avxvnni(const Query& q, int32_t h0,
                                                             float scale, int32_t d,
                                                             const HeadRows& r, float* p) {
  scores<AvxVnni, K, G>(q, h0, scale, d, r, p);
}
template <DType K, int G>
[[gnu::target("avx512f,avx512bw,avx512dq,avx512vnni,avx512vl"), gnu::flatten]] void scores_avx512vnni(
    const Query& q, int32_t h0, float scale, int32_t d, const HeadRows& r, float* p) {
  scores<Avx512Vnni, K, G>(q, h0, scale, d, r, p);
}

template <DType K, int G>
SpanKernels::Scores scores_for(Isa isa) {
  if constexpr (K == DType::F16) return scores_avx2<K, G>;  // f32 products on every set
  switch (isa) {
    case Isa::AvxVnni:
      return scores_avxvnni<K, G>;
    case Isa::Avx512Vnni:
      return scores_avx512vnni<K, G>;
    case Isa::Avx2:
      break;
  }
  return scores_avx2<K, G>;
}

template <DType K>
SpanKernels::Scores scores_for(int32_t group, Isa isa) {
  switch (group) {
    case 1:
      return scores_for<K, 1>(isa);
    case 2:
      return scores_for<K, 2>(isa);
    case 3:
      return scores_for<K, 3>(isa);
    case 4:
      return scores_for<K, 4>(isa);
    case 5:
      return scores_for<K, 5>(isa);
    case 6:
      return scores_for<K, 6>(isa);
    case 7:
      return scores_for<K, 7>(isa);
    case 8:
      return scores_for<K, 8>(isa);
    default:
      fail("cpu attention: ", group, " query heads per kv head (1 to 8)");
  }
}

// ---- softmax ----

// Every lane the max (or sum) of the lanes of its head: lanes l and l + S, l + 2 S, ... hold one
// head (S = 1, 2, 4 or 8 slots a key), combined in a fixed order.
template <class Op>
inline __m256 per_head(__m256 v, int32_t slots, Op op) {
  if (slots <= 4) v = op(v, _mm256_permute2f128_ps(v, v, 1));
  if (slots <= 2) v = op(v, _mm256_permute_ps(v, 0x4E));
  if (slots <= 1) v = op(v, _mm256_permute_ps(v, 0xB1));
  return v;
}

// p[0 .. n8) (n8 a multiple of 8; the scores of key j's head g at j S + g, -inf past the last
// key) -> e^(p - m) with m the max of the head's; returns each head's m and the sum of its e^
// (8 lanes summed in key order, then the head's lanes together) in lane g of m, l.
inline void softmax(float* p, int32_t n8, int32_t slots, __m256& m, __m256& l) {
  // The max in 4 chains (a max is exact: any order gives its bits), not one of n8 / 8 steps.
  __m256 mc[4];
  for (__m256& c : mc) c = _mm256_set1_ps(-INFINITY);
  for (int32_t j = 0; j < n8; j += 8)
    mc[j / 8 % 4] = _mm256_max_ps(mc[j / 8 % 4], _mm256_loadu_ps(p + j));
  m = _mm256_max_ps(_mm256_max_ps(mc[0], mc[1]), _mm256_max_ps(mc[2], mc[3]));
  m = per_head(m, slots, [](__m256 a, __m256 b) { return _mm256_max_ps(a, b); });
  __m256 sum = _mm256_setzero_ps();
  for (int32_t j = 0; j < n8; j += 8) {
    const __m256 e = quant::exp_ps(_mm256_sub_ps(_mm256_loadu_ps(p + j), m));
    _mm256_storeu_ps(p + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  l = per_head(sum, slots, [](__m256 a, __m256 b) { return _mm256_add_ps(a, b); });
}

// ---- values ----

// Where a pass reads the levels of V rows, unscaled (a quantized value is its block's scale
// times its level; an f16 value is itself): the rows themselves, or a tile of them in f32 (a
// prefill's, made by v_levels once for its queries). Either gives the same floats.
template <DType T>
struct RowLevels {
  const uint8_t* v;
  size_t v_row;
  int32_t nb;
  RowLevels from(int32_t j) const { return {v + static_cast<size_t>(j) * v_row, v_row, nb}; }
  const uint8_t* row(int32_t j) const { return v + static_cast<size_t>(j) * v_row; }
};
struct TileLevels {
  const float* t;
  int32_t d;
  TileLevels from(int32_t j) const { return {t + static_cast<int64_t>(j) * d, d}; }
  const float* row(int32_t j) const { return t + static_cast<int64_t>(j) * d; }
};

// Vectors of 8 (AVX2) or 16 (AVX-512) floats for the value passes, which do the same fma per
// element with either; at() gives dims [e, e + kLanes) of a row's levels.
struct Ymm {
  using V = __m256;
  static constexpr int kLanes = 8, kMaxHeads = 4;  // 16 registers: 8 accumulators
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V at(const TileLevels& l, int32_t j, int32_t e) { return load(l.row(j) + e); }
  template <class L>
  static void at2(const L& l, int32_t j, int32_t e, V& a, V& b) {
    a = at(l, j, e), b = at(l, j, e + kLanes);
  }
  template <DType T>
  static V at(const RowLevels<T>& l, int32_t j, int32_t e) {
    const uint8_t* row = l.row(j);
    if constexpr (T == DType::F16) return _mm256_cvtph_ps(quant::load16(row + 2 * e));
    if constexpr (T == DType::Q8_0)
      return quant::to_ps(quant::i8_lanes(reinterpret_cast<const int8_t*>(row + 2 * l.nb + e)));
    // q4_0: a block's elements 0-15 in the low nibbles of its 16 bytes, 16-31 in the high ones
    const int32_t o = e % 32;
    const __m256i x = quant::u8_lanes(row + 2 * l.nb + 16 * (e / 32) + o % 16);
    return quant::to_ps(
        _mm256_sub_epi32(o < 16 ? quant::low4(x) : quant::high4(x), _mm256_set1_epi32(8)));
  }
};
// Clang refuses 512-bit values through the templates' calls, which GCC's flatten inlines into
// the AVX-512 function: a clang build takes the 256-bit kernels (the same bits).
#ifndef __clang__
#define KVS_HAVE_ZMM_VALUES 1
struct Zmm {
  using V = __m512;
  static constexpr int kLanes = 16, kMaxHeads = 8;  // 32 registers: 16 accumulators
  [[gnu::target("avx512f")]] static V load(const float* p) { return _mm512_loadu_ps(p); }
  [[gnu::target("avx512f")]] static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  [[gnu::target("avx512f")]] static V bcast(const float* p) { return _mm512_set1_ps(*p); }
  [[gnu::target("avx512f")]] static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  [[gnu::target("avx512f")]] static void at2(const TileLevels& l, int32_t j, int32_t e, V& a,
                                             V& b) {
    a = load(l.row(j) + e), b = load(l.row(j) + e + kLanes);
  }
  // Dims [e, e + 32) of row j: one block of a quantized row (e % 32 == 0). A q4_0 block's
  // levels come from a table of the 16 floats level - 8, indexed by the nibbles (vpermps reads
  // an index's low 4 bits): the floats the conversion gives, in fewer operations. (The
  // conversions in their zero-masked forms with every lane kept: the plain ones trip GCC 12's
  // -Wmaybe-uninitialized on their undefined pass-through operand.)
  template <DType T>
  [[gnu::target("avx512f")]] static void at2(const RowLevels<T>& l, int32_t j, int32_t e, V& a,
                                             V& b) {
    constexpr __mmask16 all = 0xFFFF;
    const uint8_t* row = l.row(j);
    if constexpr (T == DType::F16) {
      a = _mm512_maskz_cvtph_ps(all,
                                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * e)));
      b = _mm512_maskz_cvtph_ps(
          all, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * e + 32)));
    } else if constexpr (T == DType::Q8_0) {
      a = _mm512_maskz_cvtepi32_ps(
          all, _mm512_maskz_cvtepi8_epi32(all, quant::load16(row + 2 * l.nb + e)));
      b = _mm512_maskz_cvtepi32_ps(
          all, _mm512_maskz_cvtepi8_epi32(all, quant::load16(row + 2 * l.nb + e + 16)));
    } else {
      const __m512 levels = _mm512_setr_ps(-8.0f, -7.0f, -6.0f, -5.0f, -4.0f, -3.0f, -2.0f, -1.0f,
                                           0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f);
      const __m512i x =
          _mm512_maskz_cvtepu8_epi32(all, quant::load16(row + 2 * l.nb + 16 * (e / 32)));
      a = _mm512_permutexvar_ps(x, levels);
      b = _mm512_permutexvar_ps(_mm512_maskz_srli_epi32(all, x, 4), levels);
    }
  }
};
#endif

template <DType T>
void v_levels(const uint8_t* v, size_t v_row, int32_t n, int32_t d, float* out) {
  const RowLevels<T> levels{v, v_row, d / 32};
  for (int32_t j = 0; j < n; ++j)
    for (int32_t e = 0; e < d; e += 8) Ymm::store(out + int64_t{j} * d + e, Ymm::at(levels, j, e));
}

// The value passes below are inlined into their entries (always_inline down to W's
// operations), so a Zmm vector never crosses a call outside the AVX-512 entry: GCC's note that
// such calls would change the ABI does not apply.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

// o[g * os + e .. e + 2 kLanes) += w_gj level_j for heads g < kH and keys j < n in order, an
// fma a key; w_gj at w[j wj + g wg]. A row's levels are converted once for the kH heads.
template <class W, int kH, class L>
[[gnu::always_inline]] inline void v_pass(const L& levels, int32_t e, const float* w, int64_t wj,
                                          int64_t wg, int32_t n, float* o, size_t os) {
  constexpr int k = W::kLanes;
  typename W::V acc[kH][2];
  for (int g = 0; g < kH; ++g)
    acc[g][0] = W::load(o + g * os + e), acc[g][1] = W::load(o + g * os + e + k);
  for (int32_t j = 0; j < n; ++j) {
    typename W::V a, b;
    W::at2(levels, j, e, a, b);
    for (int g = 0; g < kH; ++g) {
      const typename W::V x = W::bcast(w + j * wj + g * wg);
      acc[g][0] = W::fma(x, a, acc[g][0]);
      acc[g][1] = W::fma(x, b, acc[g][1]);
    }
  }
  for (int g = 0; g < kH; ++g)
    W::store(o + g * os + e, acc[g][0]), W::store(o + g * os + e + k, acc[g][1]);
}
template <class W, int kH, class L>
[[gnu::always_inline]] inline void v_pass_of(int heads, const L& levels, int32_t e, const float* w,
                                             int64_t wj, int64_t wg, int32_t n, float* o,
                                             size_t os) {
  if constexpr (kH <= W::kMaxHeads) {
    if (heads == kH) return v_pass<W, kH>(levels, e, w, wj, wg, n, o, os);
    v_pass_of<W, kH + 1>(heads, levels, e, w, wj, wg, n, o, os);
  }
}

constexpr int32_t kWKeys = 64;  // keys whose weights are made at a time (w: within L1)

// o[g] = the sum over keys j < n of p_gj times V row j for the group's heads, each element an
// fma per key in key order of w = p x the row's block scale (p for f16 rows) and the level.
// Heads go W::kMaxHeads at a time through a row's levels, 2 W::kLanes dimensions a pass (as
// many accumulators as the registers hold); a quantized block (32) is one or two passes.
template <class W, DType T, class L>
[[gnu::always_inline]] inline void values(const L& levels, const uint8_t* v, size_t v_row,
                                          const float* p, int32_t n, int32_t d, int32_t group,
                                          float* w, float* o, size_t os) {
  const int32_t nb = d / 32, sb = query_blocks(d), slots = score_slots(group);
  for (int32_t j0 = 0; j0 < n; j0 += kWKeys) {
    const int32_t m = std::min(kWKeys, n - j0);
    const float* wk = p + j0 * slots;  // f16: w = p
    int64_t wj = slots, wg = 1;
    if constexpr (T != DType::F16) {  // w[(j group + g) sb + b] = p_gj x scale of block b
      for (int32_t j = 0; j < m; ++j) {
        const uint8_t* row = v + static_cast<size_t>(j0 + j) * v_row;
        for (int32_t b = 0; b < nb; b += 8) {  // 16 bytes from the slice's start: within it
          const __m256 scales = _mm256_cvtph_ps(quant::load16(row + 2 * b));
          for (int32_t g = 0; g < group; ++g)
            _mm256_storeu_ps(w + (j * group + g) * sb + b,
                             _mm256_mul_ps(scales, _mm256_broadcast_ss(p + (j0 + j) * slots + g)));
        }
      }
      wk = w, wj = int64_t{group} * sb, wg = sb;
    }
    const L at = levels.from(j0);
    for (int32_t g0 = 0; g0 < group; g0 += W::kMaxHeads) {
      const int heads = std::min(W::kMaxHeads, group - g0);
      for (int32_t e = 0; e < d; e += 2 * W::kLanes)
        v_pass_of<W, 1>(heads, at, e, wk + g0 * wg + (T == DType::F16 ? 0 : e / 32), wj, wg, m,
                        o + g0 * os, os);
    }
  }
}

template <class W, DType T>
[[gnu::always_inline]] inline void values_of(const float* p, int32_t n, const uint8_t* v,
                                             size_t v_row, const float* tile, int32_t d,
                                             int32_t group, float* w, float* o) {
  const size_t os = part_stride(d);
  if (tile)
    values<W, T>(TileLevels{tile, d}, v, v_row, p, n, d, group, w, o, os);
  else
    values<W, T>(RowLevels<T>{v, v_row, d / 32}, v, v_row, p, n, d, group, w, o, os);
}

#pragma GCC diagnostic pop

template <DType T>
void values_avx2(const float* p, int32_t n, const uint8_t* v, size_t v_row, const float* tile,
                 int32_t d, int32_t group, float* w, float* o) {
  values_of<Ymm, T>(p, n, v, v_row, tile, d, group, w, o);
}
#ifdef KVS_HAVE_ZMM_VALUES
template <DType T>
[[gnu::target("avx512f,avx512vl"), gnu::flatten]] void values_avx512(const float* p, int32_t n,
                                                                     const uint8_t* v, size_t v_row,
                                                                     const float* tile, int32_t d,
                                                                     int32_t group, float* w,
                                                                     float* o) {
  values_of<Zmm, T>(p, n, v, v_row, tile, d, group, w, o);
}
#endif

template <DType T>
SpanKernels::Values values_for(Isa isa) {
#ifdef KVS_HAVE_ZMM_VALUES
  return isa == Isa::Avx512Vnni ? values_avx512<T> : values_avx2<T>;
#else
  (void)isa;
  return values_avx2<T>;
#endif
}

}  // namespace

void prepare_query(DType k_type, const float* q, int32_t n_head, int32_t d, int16_t* q16,
                   float* step, int32_t* offset) {
  if (k_type == DType::F16) return;
  const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const int32_t nb = d / 32, sb = query_blocks(d);
  for (int32_t h = 0; h < n_head; ++h)
    for (int32_t b = 0; b < nb; ++b) {
      const float* x = q + static_cast<int64_t>(h) * d + 32 * b;
      int16_t* y = q16 + static_cast<int64_t>(h) * d + 32 * b;
      __m256 mv = _mm256_setzero_ps();
      for (int c = 0; c < 4; ++c)
        mv = _mm256_max_ps(mv, _mm256_and_ps(_mm256_loadu_ps(x + 8 * c), abs));
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, mv);
      float amax = 0.0f;
      for (const float v : lanes) amax = std::max(amax, v);
      const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 32767.0f / amax : 0.0f);
      for (int c = 0; c < 4; c += 2) {
        const __m256i lo = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * c), inv));
        const __m256i hi = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * c + 8), inv));
        // packs works within 128-bit lanes: the quadwords come out as 0 2 1 3.
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + 8 * c),
                            _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xD8));
      }
      step[h * sb + b] = amax / 32767.0f;
      if (k_type != DType::Q4_0) continue;
      // -8 x the sums of q16 in the lanes of the block's dot products: (2i, 2i + 1, 16 + 2i,
      // 16 + 2i + 1) in lane i.
      const __m256i ones = _mm256_set1_epi16(1);
      const __m256i sums = _mm256_add_epi32(_mm256_madd_epi16(load256(y), ones),
                                            _mm256_madd_epi16(load256(y + 16), ones));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(offset + (h * nb + b) * 8),
                          _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sums, 3)));
    }
}

SpanKernels span_kernels(DType k_type, DType v_type, int32_t group, int32_t d, float scale,
                         Isa isa) {
  KVS_CHECK(d > 0 && d % 32 == 0 && d <= 512, "cpu attention: head size ", d,
            " (a multiple of 32, at most 512)");
  SpanKernels ks;
  ks.group = group;
  ks.d = d;
  ks.scale = scale;
  switch (k_type) {
    case DType::F16:
      ks.scores = scores_for<DType::F16>(group, isa);
      break;
    case DType::Q8_0:
      ks.scores = scores_for<DType::Q8_0>(group, isa);
      break;
    case DType::Q4_0:
      ks.scores = scores_for<DType::Q4_0>(group, isa);
      break;
    default:
      fail("cpu attention: K cache type ", dtype_name(k_type), " (f16, q8_0, q4_0)");
  }
  switch (v_type) {
    case DType::F16:
      ks.values = values_for<DType::F16>(isa);
      ks.v_levels = v_levels<DType::F16>;
      break;
    case DType::Q8_0:
      ks.values = values_for<DType::Q8_0>(isa);
      ks.v_levels = v_levels<DType::Q8_0>;
      break;
    case DType::Q4_0:
      ks.values = values_for<DType::Q4_0>(isa);
      ks.v_levels = v_levels<DType::Q4_0>;
      break;
    default:
      fail("cpu attention: V cache type ", dtype_name(v_type), " (f16, q8_0, q4_0)");
  }
  return ks;
}

size_t span_scratch(const SpanKernels& ks, int32_t n) {
  return static_cast<size_t>(score_floats(n, ks.group)) + value_scratch(ks);
}

size_t value_scratch(const SpanKernels& ks) {
  return static_cast<size_t>(ks.group) * static_cast<size_t>(kWKeys * query_blocks(ks.d));
}

void span_scores(const SpanKernels& ks, const Query& q, int32_t h0, const HeadRows& r, float* p) {
  ks.scores(q, h0, ks.scale, ks.d, r, p);
}

void span_softmax(const SpanKernels& ks, int32_t n, float* p, float* out) {
  const int32_t slots = score_slots(ks.group);
  const int64_t used = int64_t{n} * slots, n8 = (used + 7) / 8 * 8;
  std::fill(p + used, p + n8, -INFINITY);
  __m256 m, l;
  softmax(p, static_cast<int32_t>(n8), slots, m, l);
  alignas(32) float ms[8], ls[8];
  _mm256_store_ps(ms, m);
  _mm256_store_ps(ls, l);
  const size_t os = part_stride(ks.d);
  for (int32_t g = 0; g < ks.group; ++g) {
    float* o = out + g * os;
    o[0] = ms[g];
    o[1] = ls[g];
    o[2] = 1.0f;
    o[3] = 0.0f;
    std::fill(o + kPartHead, o + os, 0.0f);
  }
}

void span_values(const SpanKernels& ks, const float* p, const HeadRows& r, const float* levels,
                 float* scratch, float* out) {
  ks.values(p, r.n, r.v, r.v_row, levels, ks.d, ks.group, scratch, out + kPartHead);
}

void span_partials(const SpanKernels& ks, const Query& q, int32_t h0, const HeadRows& r,
                   const float* levels, float* scratch, float* out) {
  if (r.n <= 0) {
    for (int32_t g = 0; g < ks.group; ++g) out[g * part_stride(ks.d) + 2] = 0.0f;
    return;
  }
  float* p = scratch;  // the scores, then the probabilities
  span_scores(ks, q, h0, r, p);
  span_softmax(ks, r.n, p, out);
  span_values(ks, p, r, levels, p + score_floats(r.n, ks.group), out);
}

}  // namespace kvs::cpu
