// Prefill's span partials for a tile of queries at once, f16 keys: the queries in the lanes of a
// vector (8, or 16 with AVX-512), each lane doing the float operations span_partials does for
// its query alone, so that prefill and decode give the same bits:
// - a score: 8 chains of fma over the head's elements i (chain i % 8, in order of i), then
//   ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)) (lane_sums), times the scale;
// - the max of a head's scores; e^(s - max) by quant::exp_ps's steps; their sum in 8 / S
//   partial sums (key j in sum j % (8 / S), in key order; S = score_slots(group)), then the
//   tree per_head gives them;
// - an output element: an fma chain over the keys in order of w_j level_j, from 0 (w: the
//   probability, times the value block's scale for a quantized V).
// The kernels here interleave the chains of a tile's queries instead of those of a query's
// keys and heads: the same operations, a key's element broadcast against the tile's queries.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kvs/backend/cpu/span_attention.h"
#include "kvs/quant/blocks.h"
#include "kvs/quant/simd.h"
#include "kvs/util/error.h"

namespace kvs::cpu {
namespace {

// Vectors of the tile's lanes.
struct Lanes8 {
  using V = __m256;
  static constexpr int kLanes = 8, kGroup = 4;  // lanes whose outputs a value pass makes
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float f) { return _mm256_set1_ps(f); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static V exp(V x) { return quant::exp_ps(x); }
  // v where key j is one of lane l's (j < n[l]), -inf elsewhere.
  static V keys_of(V v, int32_t j, const int32_t* n) {
    const __m256i in = _mm256_cmpgt_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(n)),
                                          _mm256_set1_epi32(j));
    return _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), v, _mm256_castsi256_ps(in));
  }
  static V f16(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
};

// Clang refuses 512-bit values through the templates' calls, which GCC's flatten inlines into
// the AVX-512 function: a clang build takes 8 lanes (the same bits).
#ifndef __clang__
#define KVS_HAVE_TILE16 1
struct Lanes16 {
  using V = __m512;
  static constexpr int kLanes = 16, kGroup = 8;
  [[gnu::target("avx512f")]] static V zero() { return _mm512_setzero_ps(); }
  [[gnu::target("avx512f")]] static V set1(float f) { return _mm512_set1_ps(f); }
  [[gnu::target("avx512f")]] static V load(const float* p) { return _mm512_loadu_ps(p); }
  [[gnu::target("avx512f")]] static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  [[gnu::target("avx512f")]] static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  [[gnu::target("avx512f")]] static V add(V a, V b) { return _mm512_add_ps(a, b); }
  [[gnu::target("avx512f")]] static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  [[gnu::target("avx512f")]] static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  [[gnu::target("avx512f")]] static V max(V a, V b) { return _mm512_max_ps(a, b); }
  // quant::exp_ps's steps, 16 lanes.
  [[gnu::target("avx512f")]] static V exp(V x) {
    const V lo = _mm512_set1_ps(-87.33654f);
    const __mmask16 live = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, lo), _mm512_set1_ps(88.7f));
    const V n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    V y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r);
    y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
    const __m512i e =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mov_ps(live, _mm512_mul_ps(y, _mm512_castsi512_ps(e)));
  }
  [[gnu::target("avx512f")]] static V keys_of(V v, int32_t j, const int32_t* n) {
    const __mmask16 in = _mm512_cmpgt_epi32_mask(_mm512_loadu_si512(n), _mm512_set1_epi32(j));
    return _mm512_mask_blend_ps(in, _mm512_set1_ps(-INFINITY), v);
  }
  [[gnu::target("avx512f")]] static V f16(const uint8_t* p) {
    return _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
};
#endif

// The per_head tree of a head's partial sums (8 / slots of them).
template <class X>
[[gnu::always_inline]] inline typename X::V sum_tree(const typename X::V* a, int32_t slots) {
  switch (slots) {
    case 8:
      return a[0];
    case 4:
      return X::add(a[0], a[1]);
    case 2:
      return X::add(X::add(a[0], a[2]), X::add(a[1], a[3]));
    default:
      return X::add(X::add(X::add(a[0], a[4]), X::add(a[2], a[6])),
                    X::add(X::add(a[1], a[5]), X::add(a[3], a[7])));
  }
}

// The outputs of M lanes (o[m] + e .. e + 2 kLanes) over keys j < nk: an fma a key of w[j wj +
// lane m's offset lm[m]] and the key's levels there, from 0.
template <class X, int M>
[[gnu::always_inline]] inline void pass(const float* levels, int32_t d, int32_t e, const float* w,
                                        int64_t wj, const int* lm, int32_t nk, float* const* o) {
  constexpr int k = X::kLanes;
  typename X::V acc[M][2];
  for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = X::zero();
  for (int32_t j = 0; j < nk; ++j) {
    const typename X::V a = X::load(levels + int64_t{j} * d + e),
                        b = X::load(levels + int64_t{j} * d + e + k);
    for (int m = 0; m < M; ++m) {
      const typename X::V x = X::set1(w[j * wj + lm[m]]);
      acc[m][0] = X::fma(x, a, acc[m][0]);
      acc[m][1] = X::fma(x, b, acc[m][1]);
    }
  }
  for (int m = 0; m < M; ++m) X::store(o[m] + e, acc[m][0]), X::store(o[m] + e + k, acc[m][1]);
}
template <class X, int M = 1>
[[gnu::always_inline]] inline void pass_of(int lanes, const float* levels, int32_t d, int32_t e,
                                           const float* w, int64_t wj, const int* lm, int32_t nk,
                                           float* const* o) {
  if constexpr (M <= X::kGroup) {
    if (lanes == M) return pass<X, M>(levels, d, e, w, wj, lm, nk, o);
    pass_of<X, M + 1>(lanes, levels, d, e, w, wj, lm, nk, o);
  }
}

template <class X>
[[gnu::always_inline]] inline void tile(const TileArgs& t) {
  using V = typename X::V;
  constexpr int L = X::kLanes;
  const int32_t d = t.d, rows = t.rows;
  float* s = t.scratch;  // [rows][L]: the scores, then the probabilities
  // Scores: 8 chains over the elements per key, the tree, the scale, the lanes' keys.
  for (int32_t j = 0; j < rows; ++j) {
    const float* kj = t.k + int64_t{j} * d;
    V acc[8];
    for (int c = 0; c < 8; ++c) acc[c] = X::zero();
    for (int32_t i = 0; i < d; i += 8)
      for (int c = 0; c < 8; ++c)
        acc[c] = X::fma(X::load(t.qt + int64_t{i + c} * L), X::set1(kj[i + c]), acc[c]);
    const V tree = X::add(X::add(X::add(acc[0], acc[1]), X::add(acc[2], acc[3])),
                          X::add(X::add(acc[4], acc[5]), X::add(acc[6], acc[7])));
    X::store(s + int64_t{j} * L, X::keys_of(X::mul(tree, X::set1(t.scale)), j, t.n));
  }
  // Softmax: the max, e^(s - max), the partial sums by key and their tree.
  V m = X::set1(-INFINITY);
  for (int32_t j = 0; j < rows; ++j) m = X::max(m, X::load(s + int64_t{j} * L));
  const int32_t parts = 8 / t.slots;  // 1, 2, 4 or 8
  V sums[8];
  for (int c = 0; c < 8; ++c) sums[c] = X::zero();
  for (int32_t j = 0; j < rows; ++j) {
    const V p = X::exp(X::sub(X::load(s + int64_t{j} * L), m));
    X::store(s + int64_t{j} * L, p);
    sums[j & (parts - 1)] = X::add(sums[j & (parts - 1)], p);
  }
  alignas(64) float ms[L], ls[L];
  X::store(ms, m);
  X::store(ls, sum_tree<X>(sums, t.slots));
  // The weights: the probabilities, times the value block's scale for a quantized V.
  const float* w = s;
  int64_t wj = L, wb = 0;
  if (t.v_type != DType::F16) {
    const int32_t nb = d / 32;
    float* ws = s + int64_t{rows} * L;  // [rows][nb][L]
    for (int32_t j = 0; j < rows; ++j)
      for (int32_t b = 0; b < nb; ++b)
        X::store(ws + (int64_t{j} * nb + b) * L,
                 X::mul(X::load(s + int64_t{j} * L),
                        X::set1(quant::load_f16(t.v + static_cast<size_t>(j) * t.v_row + 2 * b))));
    w = ws, wj = int64_t{nb} * L, wb = L;
  }
  // The outputs, kGroup lanes at a time over their keys (a lane's weight of another's key is
  // 0, which its chains add exactly).
  int lane[L], nl = 0;
  for (int l = 0; l < L; ++l) {
    if (t.n[l] <= 0) continue;
    float* o = t.out + l * t.out_stride;
    o[0] = ms[l], o[1] = ls[l], o[2] = 1.0f, o[3] = 0.0f;
    lane[nl++] = l;
  }
  for (int f = 0; f < nl; f += X::kGroup) {
    const int cnt = std::min(X::kGroup, nl - f);
    int32_t nk = 0;
    float* o[X::kGroup];
    for (int c = 0; c < cnt; ++c) {
      nk = std::max(nk, t.n[lane[f + c]]);
      o[c] = t.out + lane[f + c] * t.out_stride + kPartHead;
    }
    for (int32_t e = 0; e < d; e += 2 * L)
      pass_of<X>(cnt, t.levels, d, e, w + (e / 32) * wb, wj, lane + f, nk, o);
  }
}

void tile8(const TileArgs& t) {
  tile<Lanes8>(t);
}
#ifdef KVS_HAVE_TILE16
[[gnu::target("avx512f"), gnu::flatten]] void tile16(const TileArgs& t) {
  tile<Lanes16>(t);
}
#endif

}  // namespace

int tile_lanes(Isa isa) {
#ifdef KVS_HAVE_TILE16
  return isa == Isa::Avx512Vnni ? 16 : 8;
#else
  (void)isa;
  return 8;
#endif
}

size_t tile_scratch(int32_t rows, int32_t d, int lanes) {
  return static_cast<size_t>(rows) * static_cast<size_t>(lanes) * static_cast<size_t>(1 + d / 32);
}

void tile_partials(const TileArgs& t) {
  KVS_CHECK(t.lanes == 8 || t.lanes == 16, "cpu attention: tiles of 8 or 16 queries");
#ifdef KVS_HAVE_TILE16
  if (t.lanes == 16) return tile16(t);
#endif
  KVS_CHECK(t.lanes == 8, "cpu attention: no 16-query tiles in this build");
  tile8(t);
}

}  // namespace kvs::cpu
