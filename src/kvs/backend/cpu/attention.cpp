// CPU attention over paged KV spans. A query head's partial over a span is one fixed sequence of
// float operations whatever the call, so results depend neither on the batch nor on where each
// page lives, nor on the instruction set:
// - score s_j = (fma chain over the head's elements i = 0 .. d - 1 of q_i k_ji, from 0) * scale;
//   prefill computes W queries' chains at once (the tile's queries transposed, a key element
//   broadcast), decode W keys' (the span's keys transposed, a query element broadcast);
// - m = the max of the span's scores; p_j = exp(s_j - m) (exp_ps, within 1 ulp);
// - the sum of the p_j in 8 partial sums (key j, counted from the span's start, in sum j % 8, in
//   key order), then ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7));
// - output_i = fma chain over the keys in order of p_j v_ji, from 0;
// and the partials fold in logical span order. W is 8 (AVX2) or 16 (AVX-512).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kvs/backend/cpu/kernels.h"
#include "kvs/backend/cpu/quant_dot.h"
#include "kvs/quant/simd.h"
#include "kvs/util/error.h"
#include "kvs/util/threadpool.h"

namespace kvs::cpu {
namespace {

std::vector<float>& scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf;
}

// Running softmax state of one query head: max, sum of exp, unnormalised output.
struct Acc {
  float m;
  float l;
  float* o;
};

// Folds a span's partial (m, l, o) into the accumulator; the fold always runs in logical span
// order, which makes the result independent of where each span's page lives.
inline void merge(Acc& acc, float m, float l, const float* o, int32_t d) {
  if (acc.l == 0.0f) {
    acc.m = m;
    acc.l = l;
    std::copy(o, o + d, acc.o);
    return;
  }
  const float mm = std::max(acc.m, m);
  const float a = std::exp(acc.m - mm), b = std::exp(m - mm);
  acc.l = acc.l * a + l * b;
  for (int32_t i = 0; i < d; ++i) acc.o[i] = acc.o[i] * a + o[i] * b;
  acc.m = mm;
}

// ---- vectors of W floats ----
// exp: quant::exp_ps's steps (the AVX-512 one too), for the scores less their max.

// The unpack stages of 8 x 8 transposes of 16-bit values, within each 128-bit lane of T:
// a[r] (row r's 8 values a lane) becomes, for column c, lane-wise rows 0 .. 7 of column c in
// out[c].
template <class T, class Lo16, class Hi16, class Lo32, class Hi32, class Lo64, class Hi64>
inline void unpack8x8(T a[8], T out[8], Lo16 lo16, Hi16 hi16, Lo32 lo32, Hi32 hi32, Lo64 lo64,
                      Hi64 hi64) {
  T b[8];
  for (int r = 0; r < 4; ++r) {
    b[r] = lo16(a[2 * r], a[2 * r + 1]);      // rows 2r, 2r + 1: columns 0-3
    b[r + 4] = hi16(a[2 * r], a[2 * r + 1]);  // columns 4-7
  }
  for (int h = 0; h < 2; ++h)  // columns 4h .. 4h + 3
    for (int r = 0; r < 2; ++r) {
      a[4 * h + 2 * r] = lo32(b[4 * h + 2 * r], b[4 * h + 2 * r + 1]);
      a[4 * h + 2 * r + 1] = hi32(b[4 * h + 2 * r], b[4 * h + 2 * r + 1]);
    }
  // a[4h + 2r + e]: rows 4r .. 4r + 3, columns 4h + 2e, 4h + 2e + 1.
  for (int h = 0; h < 2; ++h)
    for (int e = 0; e < 2; ++e) {
      out[4 * h + 2 * e] = lo64(a[4 * h + e], a[4 * h + 2 + e]);
      out[4 * h + 2 * e + 1] = hi64(a[4 * h + e], a[4 * h + 2 + e]);
    }
}

struct Avx2 {
  static constexpr int W = 8;
  static constexpr int kScoreBlocks = 2;  // of a decode pass: 16 registers
  using V = __m256;
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float f) { return _mm256_set1_ps(f); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  // Lanes l with lo[l] <= j + l * step < hi[l] kept, the others -inf.
  static V keep(V v, __m256i lanes_j, __m256i lo, __m256i hi) {
    const __m256i in = _mm256_andnot_si256(_mm256_cmpgt_epi32(lo, lanes_j),
                                           _mm256_cmpgt_epi32(hi, lanes_j));
    return _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), v, _mm256_castsi256_ps(in));
  }
  static __m256i iota() { return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); }
  static __m256i seti(int32_t v) { return _mm256_set1_epi32(v); }
  static __m256i loadi(const int32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static __m256i addi(__m256i a, __m256i b) { return _mm256_add_epi32(a, b); }
  // sum8 + the lanes in order of 8 (keys j .. j + W with j % 8 == 0).
  static __m256 add8(__m256 sum8, V v) { return _mm256_add_ps(sum8, v); }
  static float hmax(V v) {
    alignas(32) float l[8];
    _mm256_store_ps(l, v);
    float m = l[0];
    for (int i = 1; i < 8; ++i) m = std::max(m, l[i]);
    return m;
  }
  static V exp(V x) { return quant::exp_ps(x); }
  // dst[c][k] = f32 of the f16 src[k stride + 2 c], 8 keys k x 8 columns c (dst's rows ld floats
  // apart).
  static void transpose_f16(const uint8_t* src, size_t stride, float* dst, int64_t ld) {
    __m128i a[8], o[8];
    for (int r = 0; r < 8; ++r)
      a[r] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + r * stride));
    unpack8x8(a, o, _mm_unpacklo_epi16, _mm_unpackhi_epi16, _mm_unpacklo_epi32, _mm_unpackhi_epi32,
              _mm_unpacklo_epi64, _mm_unpackhi_epi64);
    for (int c = 0; c < 8; ++c) _mm256_storeu_ps(dst + c * ld, _mm256_cvtph_ps(o[c]));
  }
};

#define KVS_AVX512 gnu::target("avx512f,avx512dq,avx512vl")

struct Avx512 {
  static constexpr int W = 16;
  static constexpr int kScoreBlocks = 4;  // of a decode pass: 32 registers
  using V = __m512;
  [[KVS_AVX512]] static V zero() { return _mm512_setzero_ps(); }
  [[KVS_AVX512]] static V set1(float f) { return _mm512_set1_ps(f); }
  [[KVS_AVX512]] static V load(const float* p) { return _mm512_loadu_ps(p); }
  [[KVS_AVX512]] static V load(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  [[KVS_AVX512]] static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  [[KVS_AVX512]] static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  [[KVS_AVX512]] static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  [[KVS_AVX512]] static V add(V a, V b) { return _mm512_add_ps(a, b); }
  [[KVS_AVX512]] static V max(V a, V b) { return _mm512_max_ps(a, b); }
  [[KVS_AVX512]] static V keep(V v, __m512i lanes_j, __m512i lo, __m512i hi) {
    const __mmask16 in = _mm512_cmp_epi32_mask(lo, lanes_j, _MM_CMPINT_LE) &
                         _mm512_cmp_epi32_mask(lanes_j, hi, _MM_CMPINT_LT);
    return _mm512_mask_blend_ps(in, _mm512_set1_ps(-INFINITY), v);
  }
  [[KVS_AVX512]] static __m512i iota() {
    return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  }
  [[KVS_AVX512]] static __m512i seti(int32_t v) { return _mm512_set1_epi32(v); }
  [[KVS_AVX512]] static __m512i loadi(const int32_t* p) { return _mm512_loadu_si512(p); }
  [[KVS_AVX512]] static __m512i addi(__m512i a, __m512i b) { return _mm512_add_epi32(a, b); }
  [[KVS_AVX512]] static __m256 add8(__m256 sum8, V v) {
    return _mm256_add_ps(_mm256_add_ps(sum8, _mm512_castps512_ps256(v)), _mm512_extractf32x8_ps(v, 1));
  }
  [[KVS_AVX512]] static float hmax(V v) { return _mm512_reduce_max_ps(v); }
  // dst[c][k] = f32 of the f16 src[k stride + 2 c], 16 keys k x 8 columns c: keys k and k + 8
  // in the two lanes of a 256-bit transpose.
  [[KVS_AVX512]] static void transpose_f16(const uint8_t* src, size_t stride, float* dst,
                                           int64_t ld) {
    __m256i a[8], o[8];
    for (int r = 0; r < 8; ++r)
      a[r] = _mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + r * stride))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + (r + 8) * stride)), 1);
    unpack8x8(a, o, _mm256_unpacklo_epi16, _mm256_unpackhi_epi16, _mm256_unpacklo_epi32,
              _mm256_unpackhi_epi32, _mm256_unpacklo_epi64, _mm256_unpackhi_epi64);
    for (int c = 0; c < 8; ++c) _mm512_storeu_ps(dst + c * ld, _mm512_cvtph_ps(o[c]));
  }
  [[KVS_AVX512]] static V exp(V x) {
    const V lo = _mm512_set1_ps(-87.0f);
    const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, lo), _mm512_set1_ps(88.7f));
    const V n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    V p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i e =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mov_ps(static_cast<__mmask16>(~under),
                               _mm512_mul_ps(p, _mm512_castsi512_ps(e)));
  }
};

// The sum tree of 8 partial sums.
template <class I>
[[gnu::always_inline]] inline typename I::V tree8(const typename I::V a[8]) {
  return I::add(I::add(I::add(a[0], a[4]), I::add(a[2], a[6])),
                I::add(I::add(a[1], a[5]), I::add(a[3], a[7])));
}

// dst[c][r] = src[r][c] for an 8 x 8 block (rows at src[r], ld floats apart).
inline void transpose8(const float* const src[8], float* dst, int64_t ld) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src[i]);
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i)
    for (int k = 0; k < 2; ++k) {
      r[4 * i + 2 * k] = _mm256_shuffle_ps(t[4 * i + k], t[4 * i + k + 2], 0x44);
      r[4 * i + 2 * k + 1] = _mm256_shuffle_ps(t[4 * i + k], t[4 * i + k + 2], 0xEE);
    }
  // r[4i + 2k + h]: rows 4i .. 4i + 3, columns {2k + h, 2k + h + 4} in the two halves.
  for (int c = 0; c < 4; ++c) {
    _mm256_storeu_ps(dst + c * ld, _mm256_permute2f128_ps(r[c], r[4 + c], 0x20));
    _mm256_storeu_ps(dst + (c + 4) * ld, _mm256_permute2f128_ps(r[c], r[4 + c], 0x31));
  }
}

// o_m[0 .. d) = fma chain over the keys j < nk in order of p_m[j * ps] v[j vs + i], from 0, for
// M rows of weights at once (their chains interleaved): W elements at a time in 4 chains a row
// (the rest 8 at a time). v: f32 or f16 (uint16_t) rows, vs elements apart.
template <class I, int M, class T>
[[gnu::always_inline]] inline void weighted_sums(const float* const p[M], int64_t ps, const T* v,
                                                 int64_t vs, int32_t nk, int32_t d,
                                                 float* const o[M]) {
  using V = typename I::V;
  constexpr int W = I::W;
  int32_t i = 0;
  for (; i + 4 * W <= d; i += 4 * W) {
    V a[M][4];
    for (int m = 0; m < M; ++m)
      for (int c = 0; c < 4; ++c) a[m][c] = I::zero();
    for (int32_t j = 0; j < nk; ++j) {
      const T* vj = v + j * vs + i;
      if constexpr (sizeof(T) == 2)  // rows of the page: asked of the caches 8 keys ahead
        _mm_prefetch(reinterpret_cast<const char*>(vj + 8 * vs), _MM_HINT_T0);
      V vc[4];
      for (int c = 0; c < 4; ++c) vc[c] = I::load(vj + c * W);
      for (int m = 0; m < M; ++m) {
        const V pj = I::set1(p[m][j * ps]);
        for (int c = 0; c < 4; ++c) a[m][c] = I::fma(pj, vc[c], a[m][c]);
      }
    }
    for (int m = 0; m < M; ++m)
      for (int c = 0; c < 4; ++c) I::store(o[m] + i + c * W, a[m][c]);
  }
  for (; i < d; i += 8) {
    __m256 a[M];
    for (int m = 0; m < M; ++m) a[m] = _mm256_setzero_ps();
    for (int32_t j = 0; j < nk; ++j) {
      const __m256 vj = Avx2::load(v + j * vs + i);
      for (int m = 0; m < M; ++m) a[m] = _mm256_fmadd_ps(_mm256_set1_ps(p[m][j * ps]), vj, a[m]);
    }
    for (int m = 0; m < M; ++m) _mm256_storeu_ps(o[m] + i, a[m]);
  }
}

// weighted_sums for n rows, up to 4 at a time.
template <class I, class T>
[[gnu::always_inline]] inline void weighted_sums_n(const float* const* p, int n, int64_t ps,
                                                   const T* v, int64_t vs, int32_t nk, int32_t d,
                                                   float* const* o) {
  int m = 0;
  for (; m + 4 <= n; m += 4) weighted_sums<I, 4>(p + m, ps, v, vs, nk, d, o + m);
  switch (n - m) {
    case 3:
      return weighted_sums<I, 3>(p + m, ps, v, vs, nk, d, o + m);
    case 2:
      return weighted_sums<I, 2>(p + m, ps, v, vs, nk, d, o + m);
    case 1:
      return weighted_sums<I, 1>(p + m, ps, v, vs, nk, d, o + m);
  }
}

// s_h[0 .. B W) = the scores of H heads for B blocks of W keys (key index j0 + lane): each lane
// the chain over i of q_h[i] kt[i][lane], times scale; keys outside [lo, hi) -inf.
template <class I, int B, int H, class Idx>
[[gnu::always_inline]] inline void score_blocks(const float* const q[H], const float* kt,
                                                int64_t ld, int32_t d, float scale, int32_t j0,
                                                Idx lo, Idx hi, float* const s[H]) {
  using V = typename I::V;
  constexpr int W = I::W;
  V acc[H][B];
  for (int h = 0; h < H; ++h)
    for (int b = 0; b < B; ++b) acc[h][b] = I::zero();
  for (int32_t i = 0; i < d; ++i) {
    V k[B];
    for (int b = 0; b < B; ++b) k[b] = I::load(kt + i * ld + b * W);
    for (int h = 0; h < H; ++h) {
      const V qi = I::set1(q[h][i]);
      for (int b = 0; b < B; ++b) acc[h][b] = I::fma(qi, k[b], acc[h][b]);
    }
  }
  for (int h = 0; h < H; ++h)
    for (int b = 0; b < B; ++b) {
      const auto lanes = I::addi(I::iota(), I::seti(j0 + b * W));
      I::store(s[h] + b * W, I::keep(I::mul(acc[h][b], I::set1(scale)), lanes, lo, hi));
    }
}

// score_blocks for the keys [0, nw) (nw a multiple of W), kB blocks at a time, then one.
template <class I, int H, class Idx>
[[gnu::always_inline]] inline void score_heads(const float* const q[H], const float* kt,
                                               int32_t nw, int32_t d, float scale, int32_t jb,
                                               Idx lo, Idx hi, float* const s[H]) {
  constexpr int W = I::W, B = I::kScoreBlocks;
  float* at[H];
  int32_t j = 0;
  for (; j + B * W <= nw; j += B * W) {
    for (int h = 0; h < H; ++h) at[h] = s[h] + j;
    score_blocks<I, B, H>(q, kt + j, nw, d, scale, jb + j, lo, hi, at);
  }
  for (; j < nw; j += W) {
    for (int h = 0; h < H; ++h) at[h] = s[h] + j;
    score_blocks<I, 1, H>(q, kt + j, nw, d, scale, jb + j, lo, hi, at);
  }
}

constexpr int32_t kMaxGroup = 64;  // query heads a KV head

// Where one tile's query (or the decoding query) looks in a span: keys [j0, n) of it.
struct Range {
  int32_t j0, n;
};

// The decoding query's partials for `group` heads (q, q + d, ...) over keys [r.j0, r.n) of a
// span, into out + g * ostride: [max, sum, non-empty, output[d]]. kt: the keys [jb, jb + nw)
// transposed ([d][nw], jb = r.j0 rounded down to 8, nw a multiple of W); v: the span's rows
// (f32 or f16), vs elements apart; s: group * nw floats.
template <class I, class T>
[[gnu::always_inline]] inline void decode_partials(const float* q, int32_t group, const float* kt,
                                                   int32_t nw, const T* v, int64_t vs, Range r,
                                                   int32_t d, float scale, float* s, float* out,
                                                   int64_t ostride) {
  using V = typename I::V;
  constexpr int W = I::W;
  if (r.n <= r.j0) {
    for (int32_t g = 0; g < group; ++g) out[g * ostride + 2] = 0.0f;
    return;
  }
  const int32_t jb = r.j0 / 8 * 8;
  const auto lo = I::seti(r.j0), hi = I::seti(r.n);
  // The scores of up to 4 heads a pass over the transposed keys.
  for (int32_t g = 0; g < group; g += 4) {
    const float* qh[4];
    float* sh[4];
    for (int h = 0; h < 4; ++h) qh[h] = q + (g + h) * d, sh[h] = s + (g + h) * nw;
    switch (std::min(4, group - g)) {
      case 4:
        score_heads<I, 4>(qh, kt, nw, d, scale, jb, lo, hi, sh);
        break;
      case 3:
        score_heads<I, 3>(qh, kt, nw, d, scale, jb, lo, hi, sh);
        break;
      case 2:
        score_heads<I, 2>(qh, kt, nw, d, scale, jb, lo, hi, sh);
        break;
      default:
        score_heads<I, 1>(qh, kt, nw, d, scale, jb, lo, hi, sh);
    }
  }
  for (int32_t g = 0; g < group; ++g) {
    float* sg = s + g * nw;
    int32_t j;
    V mv = I::set1(-INFINITY);
    for (j = 0; j < nw; j += W) mv = I::max(mv, I::load(sg + j));
    const float m = I::hmax(mv);
    __m256 sum8 = _mm256_setzero_ps();
    for (j = 0; j < nw; j += W) {
      const V p = I::exp(I::add(I::load(sg + j), I::set1(-m)));
      I::store(sg + j, p);
      sum8 = I::add8(sum8, p);
    }
    float* o = out + g * ostride;
    o[0] = m, o[1] = quant::hsum(sum8), o[2] = 1.0f;
  }
  // The heads' outputs together: the chains over the keys [j0, n).
  const float* pg[kMaxGroup];
  float* og[kMaxGroup];
  for (int32_t g = 0; g < group; ++g) pg[g] = s + g * nw + (r.j0 - jb), og[g] = out + g * ostride + 3;
  weighted_sums_n<I>(pg, group, 1, v + r.j0 * vs, vs, r.n - r.j0, d, og);
}

// The partials of a tile of W queries (lanes; r[l]: lane l's keys, empty for no query) for one
// head, over a span (k, v: [n][d] f32, k with 16 more rows), into out + l * ostride: [max, sum,
// non-empty, output[d]] for the lanes with keys. qt: the queries' head transposed ([d][W]);
// s: (n + 16) * W floats.
template <class I>
[[gnu::always_inline]] inline void tile_partials(const float* qt, const Range* r, const float* k,
                                                 const float* v, int32_t d, float scale, float* s,
                                                 float* out, int64_t ostride) {
  using V = typename I::V;
  constexpr int W = I::W;
  int32_t j0[W], n[W], lo = INT32_MAX, hi = 0;
  for (int l = 0; l < W; ++l) {
    j0[l] = r[l].j0, n[l] = r[l].n;
    if (r[l].n > r[l].j0) lo = std::min(lo, r[l].j0), hi = std::max(hi, r[l].n);
  }
  if (hi == 0) return;
  const int32_t jb = lo / 8 * 8, rows = hi - jb;
  const auto lov = I::loadi(j0), hiv = I::loadi(n);
  // Scores of 8 keys at a time, each lane a query's chain over the head's elements.
  for (int32_t j = 0; j < rows; j += 8) {
    V acc[8];
    for (int b = 0; b < 8; ++b) acc[b] = I::zero();
    const float* kj = k + static_cast<int64_t>(jb + j) * d;
    for (int32_t i = 0; i < d; ++i) {
      const V qi = I::load(qt + i * W);
      for (int b = 0; b < 8; ++b) acc[b] = I::fma(qi, I::set1(kj[b * d + i]), acc[b]);
    }
    for (int b = 0; b < 8; ++b)
      I::store(s + (j + b) * W,
               I::keep(I::mul(acc[b], I::set1(scale)), I::seti(jb + j + b), lov, hiv));
  }
  const int32_t rows8 = (rows + 7) / 8 * 8;
  V m = I::set1(-INFINITY);
  for (int32_t j = 0; j < rows; ++j) m = I::max(m, I::load(s + j * W));
  const V neg_m = I::mul(m, I::set1(-1.0f));
  V sums[8];
  for (int b = 0; b < 8; ++b) sums[b] = I::zero();
  for (int32_t j = 0; j < rows8; ++j) {
    const V p = I::exp(I::add(I::load(s + j * W), neg_m));
    I::store(s + j * W, p);
    sums[j % 8] = I::add(sums[j % 8], p);
  }
  alignas(64) float mv[W], sv[W];
  I::store(mv, m);
  I::store(sv, tree8<I>(sums));
  // The outputs of the lanes with keys, 4 at a time over the union of their keys (the weights
  // of the keys outside a lane's are 0, which its chain adds exactly).
  const float* pl[W];
  float* ol[W];
  int nl = 0;
  for (int l = 0; l < W; ++l) {
    if (r[l].n <= r[l].j0) continue;
    float* o = out + l * ostride;
    o[0] = mv[l], o[1] = sv[l], o[2] = 1.0f;
    pl[nl] = s + l, ol[nl++] = o + 3;
  }
  for (int f = 0; f < nl; f += 4) {
    const int cnt = std::min(4, nl - f);
    int32_t a0 = INT32_MAX, a1 = 0;
    for (int e = 0; e < cnt; ++e) {
      const int l = static_cast<int>(pl[f + e] - s);
      a0 = std::min(a0, r[l].j0), a1 = std::max(a1, r[l].n);
    }
    const float* pm[4];
    for (int e = 0; e < cnt; ++e) pm[e] = pl[f + e] + (a0 - jb) * W;
    weighted_sums_n<I>(pm, cnt, W, v + static_cast<int64_t>(a0) * d, d, a1 - a0, d, ol + f);
  }
}

// The first key position a query at pos sees.
inline int32_t first_key(const AttentionArgs& a, int32_t pos) {
  return a.window > 0 ? pos - a.window + 1 : 0;
}

// Dequantizes rows [0, n) of head h of a span's K and V (those not null) into k, v ([n][d]
// f32), and repeats K's row n - 1 16 times (the kernels read whole groups of 8 keys from any
// first row).
void load_span(const KvLayout& l, const Span& sp, int32_t h, int32_t n, float* k, float* v) {
  const int32_t d = l.head_dim;
  const uint8_t* kp = sp.page + h * l.k_head;
  const uint8_t* vp = sp.page + l.v_offset() + h * l.v_head;
  const auto row = [d](DType t, const uint8_t* src, float* y) {
    if (t == DType::F16) {
      for (int32_t c = 0; c < d; c += 8)
        _mm256_storeu_ps(y + c, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src) + c / 8)));
    } else {
      kv_dequantize_head(t, src, y, d);
    }
  };
  for (int32_t j = 0; j < n; ++j) {
    if (k) row(l.k_type, kp + j * l.k_row, k + static_cast<int64_t>(j) * d);
    if (v) row(l.v_type, vp + j * l.v_row, v + static_cast<int64_t>(j) * d);
  }
  if (k)
    for (int32_t j = n; j < n + 16; ++j)
      std::copy(k + static_cast<int64_t>(n - 1) * d, k + static_cast<int64_t>(n) * d,
                k + static_cast<int64_t>(j) * d);
}

// Rows of K and V that a task converts (a page and the 16 copies of its last row).
inline size_t span_rows(const AttentionArgs& a) {
  return static_cast<size_t>(a.kv.page_size + 16);
}

// Decode task (kv head, span): its partials into part ([span][head][d + 3]). buf: the span's
// K, V, K transposed and scores (span_rows * (3 d + group) floats).
template <class I>
[[gnu::always_inline]] inline void decode_task(const AttentionArgs& a, int64_t task, float* part,
                                               float* buf) {
  const KvLayout& l = a.kv;
  const int32_t d = l.head_dim, group = a.n_head / l.n_head_kv, pos = a.pos[0];
  const size_t rows = span_rows(a);
  float *k = buf, *v = k + rows * d, *kt = v + rows * d, *s = kt + rows * d;
  const int32_t si = static_cast<int32_t>(task / l.n_head_kv),
                hk = static_cast<int32_t>(task % l.n_head_kv);
  const Span& sp = a.spans[si];
  const int32_t n = std::min(sp.n, pos - sp.start + 1);
  const int32_t j0 = std::clamp(first_key(a, pos) - sp.start, 0, std::max(n, 0));
  float* out = part + (static_cast<size_t>(si) * a.n_head + hk * group) * (d + 3);
  const Range r{j0, n};
  if (n <= j0) {
    for (int32_t g = 0; g < group; ++g) out[g * (d + 3) + 2] = 0.0f;
    return;
  }
  // The keys [jb, jb + nw) transposed, rows past n - 1 repeating it; f16 straight from the page.
  const bool f16k = l.k_type == DType::F16, f16v = l.v_type == DType::F16;
  if (!f16k || !f16v) load_span(l, sp, hk, n, f16k ? nullptr : k, f16v ? nullptr : v);
  const int32_t jb = j0 / 8 * 8, nw = (n - jb + I::W - 1) / I::W * I::W;
  const uint8_t* kp = sp.page + hk * l.k_head;
  if (f16k) {
    // Whole groups of W keys from the page, the last one from a copy with its rows repeated.
    uint8_t last[I::W * 512];  // W rows of a head of at most 256 f16 values
    KVS_CHECK(l.k_head <= 512, "cpu attention: f16 heads of at most 256");
    for (int32_t j = 0; j < nw; j += I::W) {
      const uint8_t* src = kp + (jb + j) * l.k_row;
      size_t stride = l.k_row;
      for (int e = 0; e < I::W; ++e)  // the next group's rows, asked of the caches
        for (size_t off = 0; off < l.k_head; off += 64)
          _mm_prefetch(reinterpret_cast<const char*>(src + (I::W + e) * stride + off), _MM_HINT_T0);
      if (jb + j + I::W > n) {
        for (int e = 0; e < I::W; ++e)
          std::memcpy(last + e * l.k_head, kp + std::min(jb + j + e, n - 1) * l.k_row, l.k_head);
        src = last, stride = l.k_head;
      }
      for (int32_t i = 0; i < d; i += 8)
        I::transpose_f16(src + 2 * i, stride, kt + static_cast<int64_t>(i) * nw + j, nw);
    }
  } else {
    for (int32_t j = 0; j < nw; j += 8) {
      const float* src[8];
      for (int e = 0; e < 8; ++e) src[e] = k + static_cast<int64_t>(std::min(jb + j + e, n - 1)) * d;
      for (int32_t i = 0; i < d; i += 8) {
        transpose8(src, kt + static_cast<int64_t>(i) * nw + j, nw);
        for (int e = 0; e < 8; ++e) src[e] += 8;
      }
    }
  }
  const float* q = a.q + hk * group * d;
  if (f16v) {
    const auto* vp = reinterpret_cast<const uint16_t*>(sp.page + l.v_offset() + hk * l.v_head);
    decode_partials<I>(q, group, kt, nw, vp, static_cast<int64_t>(l.v_row / 2), r, d, a.scale, s,
                       out, d + 3);
  } else {
    decode_partials<I>(q, group, kt, nw, v, d, r, d, a.scale, s, out, d + 3);
  }
}

// The floats of a prefill task's buffer: K, V and scores of a span, the queries transposed and
// the partials.
inline size_t prefill_floats(const AttentionArgs& a, int w) {
  const int32_t d = a.kv.head_dim, group = a.n_head / a.kv.n_head_kv;
  return span_rows(a) * static_cast<size_t>(2 * d + w) + static_cast<size_t>(group * d * w) +
         static_cast<size_t>(w * group * (d + 3));
}

// Prefill task (kv head, tile of W queries): the spans folded in order as they are read.
template <class I>
[[gnu::always_inline]] inline void prefill_task(const AttentionArgs& a, int64_t task, float* buf) {
  constexpr int W = I::W;
  const KvLayout& l = a.kv;
  const int32_t d = l.head_dim, group = a.n_head / l.n_head_kv;
  const int64_t qstride = static_cast<int64_t>(a.n_head) * d, ostride = group * (d + 3);
  const size_t rows = span_rows(a);
  float *k = buf, *v = k + rows * d, *s = v + rows * d, *qt = s + rows * W;
  float* po = qt + static_cast<size_t>(group) * d * W;
  const int32_t tile = static_cast<int32_t>(task / l.n_head_kv),
                hk = static_cast<int32_t>(task % l.n_head_kv);
  const int32_t t0 = tile * W, nq = std::min(a.n_tok - t0, W);
  // The tile's queries transposed per head: qt[g][i][lane] (lanes past nq: zeros).
  std::fill(qt, qt + static_cast<size_t>(group) * d * W, 0.0f);
  for (int32_t g = 0; g < group; ++g)
    for (int32_t t = 0; t < nq; ++t)
      for (int32_t i = 0; i < d; ++i)
        qt[(static_cast<size_t>(g) * d + i) * W + t] =
            a.q[(t0 + t) * qstride + (hk * group + g) * d + i];
  int32_t max_pos = 0, min_pos = INT32_MAX;
  for (int32_t t = t0; t < t0 + nq; ++t)
    max_pos = std::max(max_pos, a.pos[t]), min_pos = std::min(min_pos, a.pos[t]);
  for (int32_t si = 0; si < a.n_spans; ++si) {
    const Span& sp = a.spans[si];
    if (sp.start > max_pos) break;
    if (sp.start + sp.n <= first_key(a, min_pos)) continue;  // before every window
    load_span(l, sp, hk, std::min(sp.n, max_pos - sp.start + 1), k, v);
    Range r[W] = {};
    for (int32_t t = 0; t < nq; ++t) {
      const int32_t pos = a.pos[t0 + t];
      const int32_t n = std::min(sp.n, pos - sp.start + 1);
      const int32_t j0 = std::max(0, first_key(a, pos) - sp.start);
      if (n > j0) r[t] = Range{j0, n};
    }
    for (int32_t g = 0; g < group; ++g)
      tile_partials<I>(qt + static_cast<size_t>(g) * d * W, r, k, v, d, a.scale, s,
                       po + g * (d + 3), ostride);
    for (int32_t t = 0; t < nq; ++t) {
      if (r[t].n <= r[t].j0) continue;
      for (int32_t g = 0; g < group; ++g) {
        const int32_t h = hk * group + g;
        const float* pg = po + t * ostride + g * (d + 3);
        float* st = a.acc + 2 * (int64_t{t0 + t} * a.n_head + h);
        Acc acc{st[0], st[1], a.out + (t0 + t) * qstride + h * d};
        merge(acc, pg[0], pg[1], pg + 3, d);
        st[0] = acc.m;
        st[1] = acc.l;
      }
    }
  }
}

// The tasks compiled for each instruction set.
void decode_avx2(const AttentionArgs& a, int64_t task, float* part, float* buf) {
  decode_task<Avx2>(a, task, part, buf);
}
[[KVS_AVX512, gnu::flatten]] void decode_avx512(const AttentionArgs& a, int64_t task, float* part,
                                                 float* buf) {
  decode_task<Avx512>(a, task, part, buf);
}
void prefill_avx2(const AttentionArgs& a, int64_t task, float* buf) {
  prefill_task<Avx2>(a, task, buf);
}
[[KVS_AVX512, gnu::flatten]] void prefill_avx512(const AttentionArgs& a, int64_t task, float* buf) {
  prefill_task<Avx512>(a, task, buf);
}

bool has_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  return yes;
}

}  // namespace

void attention(const AttentionArgs& a, DotIsa isa) {
  const int32_t d = a.kv.head_dim;
  KVS_CHECK(d % 8 == 0, "cpu attention: head size ", d, " is not a multiple of 8");
  KVS_CHECK(a.n_head / a.kv.n_head_kv <= kMaxGroup, "cpu attention: more than ", kMaxGroup,
            " query heads a KV head");
  // acc[(t * n_head + h) * 2 + {0, 1}]: running max and sum; a sum of 0 means "nothing yet".
  if (a.first)
    for (int64_t i = 0; i < int64_t{a.n_tok} * a.n_head; ++i) a.acc[2 * i + 1] = 0.0f;
  const KvLayout& l = a.kv;
  const bool wide = isa == DotIsa::Avx512Vnni && has_avx512();
  if (a.n_tok == 1 && a.n_spans > 0) {
    // Decode: one task per (kv head, span) stores its partials; then a fold per head in
    // logical order.
    const int32_t ns = a.n_spans;
    std::vector<float>& part = scratch(static_cast<size_t>(ns) * a.n_head * (d + 3));
    thread_pool().parallel_for(static_cast<int64_t>(ns) * l.n_head_kv, 1, [&](int64_t b, int64_t e) {
      thread_local std::vector<float> buf;
      const size_t need = span_rows(a) * static_cast<size_t>(3 * d + a.n_head / l.n_head_kv);
      if (buf.size() < need) buf.resize(need);
      for (int64_t task = b; task < e; ++task)
        (wide ? decode_avx512 : decode_avx2)(a, task, part.data(), buf.data());
    });
    for (int32_t h = 0; h < a.n_head; ++h) {
      Acc acc{a.acc[2 * h], a.acc[2 * h + 1], a.out + h * d};
      for (int32_t s = 0; s < ns; ++s) {
        const float* p = part.data() + (static_cast<size_t>(s) * a.n_head + h) * (d + 3);
        if (p[2] != 0.0f) merge(acc, p[0], p[1], p + 3, d);
      }
      a.acc[2 * h] = acc.m;
      a.acc[2 * h + 1] = acc.l;
    }
  } else if (a.n_spans > 0) {
    // Prefill: one task per (kv head, tile of W queries).
    const int w = wide ? Avx512::W : Avx2::W;
    const int32_t n_tiles = (a.n_tok + w - 1) / w;
    thread_pool().parallel_for(static_cast<int64_t>(n_tiles) * l.n_head_kv, 1, [&](int64_t b, int64_t e) {
      thread_local std::vector<float> buf;
      if (buf.size() < prefill_floats(a, w)) buf.resize(prefill_floats(a, w));
      for (int64_t task = b; task < e; ++task)
        (wide ? prefill_avx512 : prefill_avx2)(a, task, buf.data());
    });
  }
  if (!a.last) return;
  for (int64_t i = 0; i < int64_t{a.n_tok} * a.n_head; ++i) {
    const float inv = 1.0f / a.acc[2 * i + 1];
    float* o = a.out + i * d;
    for (int32_t j = 0; j < d; ++j) o[j] *= inv;
  }
}

}  // namespace kvs::cpu
