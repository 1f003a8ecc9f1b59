#include "kvs/backend/cpu/quant_dot.h"

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <utility>

#include "kvs/backend/cpu/quant_lanes.h"
#include "kvs/quant/blocks.h"
#include "kvs/quant/simd.h"
#include "kvs/util/error.h"
#include "kvs/util/threadpool.h"

namespace kvs::cpu {
namespace {

using namespace quant;
using namespace lanes;

// ---- kernels ----

#define KVS_AVX512 gnu::target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")
// Clang refuses 512-bit values through the templates' calls, which GCC's flatten inlines into
// the AVX-512 function: a clang build takes the 256-bit kernels there (the same bits).
#ifndef __clang__
#define KVS_HAVE_AVX512_KERNELS 1
#endif
// Per output and group (quant_dot.h): the level bytes u[k] of a row widened to int16 once, in
// XGroup::v's order, and multiplied against each token's v in vpmaddwd (AVX2) or vpdpwssd
// (AVX-VNNI, AVX-512 VNNI); the sums start at -2^kShift sum x for offset levels, so that they
// are sum (u - 2^kShift) x. Each lane of a sum is at most 32 x 128 x 32385: within int32.

// u's even bytes (a) and odd bytes (b) as int16, with their sign for signed levels.
template <bool kSigned>
[[gnu::always_inline]] inline void widen(__m256i u, __m256i& a, __m256i& b) {
  if constexpr (kSigned) {
    a = _mm256_srai_epi16(_mm256_slli_epi16(u, 8), 8);
    b = _mm256_srai_epi16(u, 8);
  } else {
    a = _mm256_and_si256(u, _mm256_set1_epi16(0xFF));
    b = _mm256_srli_epi16(u, 8);
  }
}

struct Madd16 {
  static constexpr bool kFused = false;
  static __m256i dot(__m256i acc, __m256i a, __m256i v) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, v));
  }
};
struct Dpwssd16 {
  static constexpr bool kFused = true;
  [[gnu::target("avxvnni")]] static __m256i dot(__m256i acc, __m256i a, __m256i v) {
    return _mm256_dpwssd_avx_epi32(acc, a, v);
  }
};

// The float steps of a group for one output (quant_dot.h): sum[1] is the last 16's with k16.
template <class F>
[[gnu::always_inline]] inline __m256 float_steps(__m256 acc, const __m256i sum[2], const Scales& s,
                                                 const XGroup& x) {
  const __m256 d = _mm256_load_ps(x.d);
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[0]), _mm256_mul_ps(s.d, d), acc);
  if constexpr (F::k16)
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[1]), _mm256_mul_ps(s.dh, d), acc);
  if constexpr (F::kMin && !F::k16) acc = _mm256_fmadd_ps(s.m, _mm256_load_ps(x.s[0]), acc);
  if constexpr (F::kMin && F::k16) {
    acc = _mm256_fmadd_ps(s.m, _mm256_load_ps(x.s[1]), acc);
    acc = _mm256_fmadd_ps(s.mh, _mm256_load_ps(x.s[2]), acc);
  }
  return acc;
}

// The sums' start: -2^kShift sum x (of the sub-block, or of each half with k16), else zero.
template <class F>
[[gnu::always_inline]] inline __m256i sum_start(const XGroup& x, int h) {
  if constexpr (F::kShift == 0) return _mm256_setzero_si256();
  const int i = F::k16 ? 1 + h : 0;
  return _mm256_slli_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(x.nsum[i])),
                           F::kShift);
}

// Independent sums per output and sub-block for a tile of T tokens: vpdpwssd accumulates in
// place, 5 cycles a step, so one or two tokens' chains alone would wait on it.
// (vpmaddwd's sums go through vpaddd, one cycle).
template <bool kFused, int T>
inline constexpr int kSplit = !kFused || T >= 4 ? 1 : 4 / T;

// One row's integer sums of group g for T tokens, out[t][h] (h: the half with k16): its K level
// vectors (8, or 4 in a half group, whose sums are then folded into lanes 0 .. 3) widened once.
template <class F, class D, int T, int K>
[[gnu::always_inline]] inline void group_sums(const __m256i* u, const XGroup* x, int64_t ng,
                                              int64_t g, __m256i out[T][2]) {
  constexpr int H = F::k16 ? 2 : 1, A = kSplit<D::kFused, T>;
  __m256i sum[T][2][A];
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      sum[t][h][0] = sum_start<F>(x[t * ng + g], h);
      for (int i = 1; i < A; ++i) sum[t][h][i] = _mm256_setzero_si256();
    }
    // Unrolled: the sums stay in registers only when their indices are constants.
#pragma GCC unroll 8
  for (int k = 0; k < K; ++k) {
    __m256i a, b;
    widen<F::kSigned>(u[k], a, b);
    for (int t = 0; t < T; ++t) {
      const auto* v = reinterpret_cast<const __m256i*>(x[t * ng + g].v) + 2 * k;
      __m256i& sk = sum[t][H == 2 ? k / 4 : 0][k % A];
      sk = D::dot(D::dot(sk, a, _mm256_load_si256(v)), b, _mm256_load_si256(v + 1));
      // Kept in its register here: GCC otherwise reorders the sums into a tree of all the
      // products and spills them.
      asm("" : "+x"(sk));
    }
  }
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      __m256i v = sum[t][h][0];
      for (int i = 1; i < A; ++i) v = _mm256_add_epi32(v, sum[t][h][i]);
      if constexpr (K == 4)
        v = _mm256_zextsi128_si256(
            _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
      out[t][h] = v;
    }
}

// Group g of one row: its scales and its sums for T tokens.
template <class F, class D, int T>
[[gnu::always_inline]] inline void row_group(const uint8_t* row, int64_t g, int64_t n_sub,
                                             const XGroup* x, int64_t ng, Scales& s,
                                             __m256i sum[T][2]) {
  __m256i u[8];
  if constexpr (F::kHalves) {
    if (half_group(g, n_sub)) {
      F::half_group(row, g, n_sub, s, u);
      return group_sums<F, D, T, 4>(u, x, ng, g, sum);
    }
  }
  F::group(row, g, n_sub, s, u);
  group_sums<F, D, T, 8>(u, x, ng, g, sum);
}

// y[t ldy + r] for R rows (w, ld bytes apart) and T tokens (x, ng groups apart), 256-bit lanes:
// each row's group unpacked and widened once for the T tokens.
template <class F, class D, int R, int T>
[[gnu::always_inline]] inline void tile16(const uint8_t* w, size_t ld, const XGroup* x, int64_t ng,
                                          int64_t n_sub, float* y, int64_t ldy) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  for (int64_t g = 0; g < ng; ++g) {
    for (int r = 0; r < R; ++r) {
      Scales s;
      __m256i sum[T][2];
      row_group<F, D, T>(w + r * ld, g, n_sub, x, ng, s, sum);
      for (int t = 0; t < T; ++t) acc[r][t] = float_steps<F>(acc[r][t], sum[t], s, x[t * ng + g]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) y[t * ldy + r] = hsum(acc[r][t]);
}

// The rows eight tiles of `rows` rows on (past the task's too: the next task's), asked of the
// caches now: the tiles of one token (and of a few) would otherwise wait on memory, not on
// arithmetic. Always inlined: GCC finds a
// function of prefetches alone free of effects and drops its calls before the entries' flatten
// would inline it.
[[gnu::always_inline]] inline void prefetch_ahead(const uint8_t* w, size_t ld, int64_t rows) {
  const uint8_t* next = w + 8 * rows * ld;
  for (size_t off = 0; off < rows * ld; off += 64)
    _mm_prefetch(reinterpret_cast<const char*>(next + off), _MM_HINT_T0);
}

// Tokens in tiles of 4 (a verify step of 4, or prefill, unpacks each row once for the 4), then
// 2, then 1 (decode: 2 rows at a time).
template <class F, class D>
[[gnu::always_inline]] inline void rows16(const Matrix& w, const XGroup* x, int64_t n_tok,
                                          int64_t r0, int64_t nr, float* y, int64_t ldy) {
  const int64_t ng = x_groups(w.n_in), n_sub = w.n_in / QK;
  const size_t ld = w.row_bytes;
  const uint8_t* w0 = w.row(r0);
  // A template, not a function pointer: the tile must inline into its instruction set's entry.
  const auto each_row = [&]<int T>(int64_t t) {
    for (int64_t r = 0; r < nr; ++r) {
      prefetch_ahead(w0 + r * ld, ld, 1);
      tile16<F, D, 1, T>(w0 + r * ld, ld, x + t * ng, ng, n_sub, y + t * ldy + r, ldy);
    }
  };
  int64_t t = 0;
  for (; t + 8 <= n_tok; t += 8) each_row.template operator()<8>(t);
  if (t + 4 <= n_tok) {
    each_row.template operator()<4>(t);
    t += 4;
  }
  if (t + 2 <= n_tok) {
    each_row.template operator()<2>(t);
    t += 2;
  }
  if (t < n_tok) {
    int64_t r = 0;
    for (; r + 2 <= nr; r += 2) {
      prefetch_ahead(w0 + r * ld, ld, 2);
      tile16<F, D, 2, 1>(w0 + r * ld, ld, x + t * ng, ng, n_sub, y + t * ldy + r, ldy);
    }
    for (; r < nr; ++r)
      tile16<F, D, 1, 1>(w0 + r * ld, ld, x + t * ng, ng, n_sub, y + t * ldy + r, ldy);
  }
}

#ifdef KVS_HAVE_AVX512_KERNELS
// The 256-bit kernels' products in AVX-512 VNNI's VL form (a pair's odd row).
struct Dpwssd16Vl {
  static constexpr bool kFused = true;
  [[KVS_AVX512]] static __m256i dot(__m256i acc, __m256i a, __m256i v) {
    return _mm256_dpwssd_epi32(acc, a, v);
  }
};

[[KVS_AVX512, gnu::always_inline]] inline __m512 join(__m256 a, __m256 b) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(a), b, 1);
}

// group_sums() for two rows in 512-bit lanes: row 0 in lanes 0 .. 7, row 1 in 8 .. 15, a
// token's group broadcast to both halves.
template <class F, int T, int K>
[[KVS_AVX512, gnu::always_inline]] inline void group_sums512(const __m256i* u0, const __m256i* u1,
                                                             const XGroup* x, int64_t ng, int64_t g,
                                                             __m512i out[T][2]) {
  constexpr int H = F::k16 ? 2 : 1, A = kSplit<true, T>;
  __m512i sum[T][2][A];
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      sum[t][h][0] = _mm512_broadcast_i64x4(sum_start<F>(x[t * ng + g], h));
      for (int i = 1; i < A; ++i) sum[t][h][i] = _mm512_setzero_si512();
    }
#pragma GCC unroll 8
  for (int k = 0; k < K; ++k) {
    const __m512i u = _mm512_inserti64x4(_mm512_castsi256_si512(u0[k]), u1[k], 1);
    __m512i a, b;
    if constexpr (F::kSigned) {
      a = _mm512_srai_epi16(_mm512_slli_epi16(u, 8), 8);
      b = _mm512_srai_epi16(u, 8);
    } else {
      a = _mm512_and_si512(u, _mm512_set1_epi16(0xFF));
      b = _mm512_srli_epi16(u, 8);
    }
    for (int t = 0; t < T; ++t) {
      const auto* v = reinterpret_cast<const __m256i*>(x[t * ng + g].v) + 2 * k;
      __m512i& sk = sum[t][H == 2 ? k / 4 : 0][k % A];
      sk = _mm512_dpwssd_epi32(sk, a, _mm512_broadcast_i64x4(_mm256_load_si256(v)));
      sk = _mm512_dpwssd_epi32(sk, b, _mm512_broadcast_i64x4(_mm256_load_si256(v + 1)));
    }
  }
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      __m512i v = sum[t][h][0];
      for (int i = 1; i < A; ++i) v = _mm512_add_epi32(v, sum[t][h][i]);
      if constexpr (K == 4)  // each row's two 128-bit halves added into the first
        v = _mm512_maskz_mov_epi64(0x33, _mm512_add_epi32(v, _mm512_shuffle_i64x2(v, v, 0xB1)));
      out[t][h] = v;
    }
}

// tile16() for two rows at once, in 512-bit lanes: the same integers and the same float steps
// per lane.
template <class F, int T>
[[KVS_AVX512, gnu::always_inline]] inline void tile512(const uint8_t* w, size_t ld, const XGroup* x,
                                                       int64_t ng, int64_t n_sub, float* y,
                                                       int64_t ldy) {
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < ng; ++g) {
    Scales s0, s1;
    __m256i u0[8], u1[8];
    __m512i sum[T][2];
    bool half = false;
    if constexpr (F::kHalves) half = half_group(g, n_sub);
    if (half) {
      if constexpr (F::kHalves) {
        F::half_group(w, g, n_sub, s0, u0);
        F::half_group(w + ld, g, n_sub, s1, u1);
        group_sums512<F, T, 4>(u0, u1, x, ng, g, sum);
      }
    } else {
      F::group(w, g, n_sub, s0, u0);
      F::group(w + ld, g, n_sub, s1, u1);
      group_sums512<F, T, 8>(u0, u1, x, ng, g, sum);
    }
    for (int t = 0; t < T; ++t) {
      const XGroup& xg = x[t * ng + g];
      const __m512 d = _mm512_broadcast_f32x8(_mm256_load_ps(xg.d));
      __m512& a = acc[t];
      a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[t][0]), _mm512_mul_ps(join(s0.d, s1.d), d), a);
      if constexpr (F::k16)
        a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[t][1]), _mm512_mul_ps(join(s0.dh, s1.dh), d), a);
      if constexpr (F::kMin && !F::k16)
        a = _mm512_fmadd_ps(join(s0.m, s1.m), _mm512_broadcast_f32x8(_mm256_load_ps(xg.s[0])), a);
      if constexpr (F::kMin && F::k16) {
        a = _mm512_fmadd_ps(join(s0.m, s1.m), _mm512_broadcast_f32x8(_mm256_load_ps(xg.s[1])), a);
        a = _mm512_fmadd_ps(join(s0.mh, s1.mh), _mm512_broadcast_f32x8(_mm256_load_ps(xg.s[2])), a);
      }
    }
  }
  for (int t = 0; t < T; ++t) {
    y[t * ldy] = hsum(_mm512_castps512_ps256(acc[t]));
    y[t * ldy + 1] = hsum(_mm512_extractf32x8_ps(acc[t], 1));
  }
}

// T tokens against the rows in pairs (an odd last row by the VL kernel).
template <class F, int T>
[[KVS_AVX512, gnu::always_inline]] inline void pairs512(const uint8_t* w0, size_t ld, int64_t nr,
                                                        const XGroup* x, int64_t ng, int64_t n_sub,
                                                        float* y, int64_t ldy) {
  int64_t r = 0;
  for (; r + 2 <= nr; r += 2) {
    prefetch_ahead(w0 + r * ld, ld, 2);
    tile512<F, T>(w0 + r * ld, ld, x, ng, n_sub, y + r, ldy);
  }
  if (r < nr) {
    constexpr int T1 = T > 4 ? 4 : T;
    for (int64_t i = 0; i < T; i += T1)
      tile16<F, Dpwssd16Vl, 1, T1>(w0 + r * ld, ld, x + i * ng, ng, n_sub, y + i * ldy + r, ldy);
  }
}

// Tokens in tiles of 8, then 4, 2 and 1.
template <class F>
[[KVS_AVX512, gnu::always_inline]] inline void rows512(const Matrix& w, const XGroup* x,
                                                       int64_t n_tok, int64_t r0, int64_t nr,
                                                       float* y, int64_t ldy) {
  const int64_t ng = x_groups(w.n_in), n_sub = w.n_in / QK;
  const size_t ld = w.row_bytes;
  const uint8_t* w0 = w.row(r0);
  int64_t t = 0;
  for (; t + 8 <= n_tok; t += 8)
    pairs512<F, 8>(w0, ld, nr, x + t * ng, ng, n_sub, y + t * ldy, ldy);
  if (t + 4 <= n_tok) {
    pairs512<F, 4>(w0, ld, nr, x + t * ng, ng, n_sub, y + t * ldy, ldy);
    t += 4;
  }
  if (t + 2 <= n_tok) {
    pairs512<F, 2>(w0, ld, nr, x + t * ng, ng, n_sub, y + t * ldy, ldy);
    t += 2;
  }
  if (t < n_tok) pairs512<F, 1>(w0, ld, nr, x + t * ng, ng, n_sub, y + t * ldy, ldy);
}
#endif

// K: rows16<F, Madd16 or Dpwssd16>, or rows512<F>.
template <template <class> class K>
[[gnu::always_inline]] inline void rows_of(const Matrix& w, const XGroup* x, int64_t n_tok,
                                           int64_t r0, int64_t nr, float* y, int64_t ldy) {
  switch (w.type) {
    case DType::Q8_0:
      return K<Blocks<Q8_0>>::run(w, x, n_tok, r0, nr, y, ldy);
    case DType::Q4_0:
      return K<Blocks<Q4_0>>::run(w, x, n_tok, r0, nr, y, ldy);
    case DType::Q4_1:
      return K<Blocks<Q4_1>>::run(w, x, n_tok, r0, nr, y, ldy);
    case DType::Q5_0:
      return K<Blocks<Q5_0>>::run(w, x, n_tok, r0, nr, y, ldy);
    case DType::Q5_1:
      return K<Blocks<Q5_1>>::run(w, x, n_tok, r0, nr, y, ldy);
    case DType::IQ4_NL:
      return K<Blocks<IQ4_NL>>::run(w, x, n_tok, r0, nr, y, ldy);
    case DType::Q2_K:
      return K<Q2_K>::run(w, x, n_tok, r0, nr, y, ldy);
    case DType::Q3_K:
      return K<Q3_K>::run(w, x, n_tok, r0, nr, y, ldy);
    case DType::Q4_K:
      return K<Q4_K>::run(w, x, n_tok, r0, nr, y, ldy);
    case DType::Q5_K:
      return K<Q5_K>::run(w, x, n_tok, r0, nr, y, ldy);
    case DType::Q6_K:
      return K<Q6_K>::run(w, x, n_tok, r0, nr, y, ldy);
    case DType::IQ4_XS:
      return K<IQ4_XS>::run(w, x, n_tok, r0, nr, y, ldy);
    default:
      fail("int_matmul_rows: no integer kernel for ", dtype_name(w.type));
  }
}

template <class F>
struct Avx2Rows {
  [[gnu::always_inline]] static void run(const Matrix& w, const XGroup* x, int64_t n_tok,
                                         int64_t r0, int64_t nr, float* y, int64_t ldy) {
    rows16<F, Madd16>(w, x, n_tok, r0, nr, y, ldy);
  }
};
template <class F>
struct AvxVnniRows {
  [[gnu::always_inline]] static void run(const Matrix& w, const XGroup* x, int64_t n_tok,
                                         int64_t r0, int64_t nr, float* y, int64_t ldy) {
    rows16<F, Dpwssd16>(w, x, n_tok, r0, nr, y, ldy);
  }
};

// One entry per instruction set, compiled for it (the kernels are inlined into it).
[[gnu::flatten]] void rows_avx2(const Matrix& w, const XGroup* x, int64_t n_tok, int64_t r0,
                                int64_t nr, float* y, int64_t ldy) {
  rows_of<Avx2Rows>(w, x, n_tok, r0, nr, y, ldy);
}
[[gnu::target("avxvnni"), gnu::flatten]] void rows_avxvnni(const Matrix& w, const XGroup* x,
                                                           int64_t n_tok, int64_t r0, int64_t nr,
                                                           float* y, int64_t ldy) {
  rows_of<AvxVnniRows>(w, x, n_tok, r0, nr, y, ldy);
}
#ifdef KVS_HAVE_AVX512_KERNELS
template <class F>
struct Avx512Rows {
  // Not always_inline: rows_of() is compiled for AVX2 before the entry's flatten takes it in.
  [[KVS_AVX512]] static void run(const Matrix& w, const XGroup* x, int64_t n_tok, int64_t r0,
                                 int64_t nr, float* y, int64_t ldy) {
    rows512<F>(w, x, n_tok, r0, nr, y, ldy);
  }
};
[[KVS_AVX512, gnu::flatten]] void rows_avx512(const Matrix& w, const XGroup* x, int64_t n_tok,
                                              int64_t r0, int64_t nr, float* y, int64_t ldy) {
  rows_of<Avx512Rows>(w, x, n_tok, r0, nr, y, ldy);
}
#endif

}  // namespace

bool has_int_dot(DType t) {
  switch (t) {
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::IQ4_NL:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::IQ4_XS:
      return true;
    default:
      return false;
  }
}

namespace {

// A 32-element format's block (quant_lanes.h: [d][m][qh][levels]) and its CPU layout.
struct Shape {
  size_t block, scales, qh, levels, group, half;  // bytes; scales: d (and m) per block
  bool min, nibbles;
};
template <class B>
constexpr Shape shape_of() {
  using L = Blocks<B>;
  return {B::kBytes, L::kScales,    L::kQhBytes, L::kLevels,
          L::kGroup, L::kHalfGroup, B::kMin,     B::kNibbles};
}
bool shape(DType t, Shape& s) {
  switch (t) {
    case DType::Q8_0:
      return s = shape_of<Q8_0>(), true;
    case DType::Q4_0:
      return s = shape_of<Q4_0>(), true;
    case DType::Q4_1:
      return s = shape_of<Q4_1>(), true;
    case DType::Q5_0:
      return s = shape_of<Q5_0>(), true;
    case DType::Q5_1:
      return s = shape_of<Q5_1>(), true;
    case DType::IQ4_NL:
      return s = shape_of<IQ4_NL>(), true;
    default:
      return false;
  }
}

// Calls f(file byte, its shift, layout byte, its shift, mask, bytes) for each piece of the
// row's blocks: d, m and qh whole, a whole group's levels as dwords (the byte holding elements
// e and e + 16 of a nibble format stays whole), a half group's a level per byte (q8_0) or
// nibble (the others). A half group's qh is in lanes j and j + 4.
template <class F>
void each_piece(const Shape& s, int64_t n_in, F f) {
  const int64_t n_sub = n_in / 32;
  for (int64_t i = 0; i < n_sub; ++i) {
    const int64_t g = i / 8;
    const int j = static_cast<int>(i % 8);
    const bool half = half_group(g, n_sub);
    const size_t at = static_cast<size_t>(i) * s.block, grp = static_cast<size_t>(g) * s.group;
    const size_t lanes = half ? 4 : 8, hdr = grp + lanes * s.scales;
    f(at, 0, grp + 2 * j, 0, 0xFF, 2);
    if (s.min) f(at + 2, 0, grp + 2 * lanes + 2 * j, 0, 0xFF, 2);
    const size_t qh = at + s.scales;
    if (s.qh) {
      f(qh, 0, hdr + 4 * j, 0, 0xFF, 4);
      if (half) f(qh, 0, hdr + 4 * (j + 4), 0, 0xFF, 4);
    }
    const size_t qs = qh + (s.qh ? 4 : 0), lv = hdr + s.qh;
    if (!half) {  // dword k of block j in lane j of vector k
      for (size_t k = 0; k < (s.nibbles ? 4 : 8); ++k)
        f(qs + 4 * k, 0, lv + 32 * k + 4 * j, 0, 0xFF, 4);
      continue;
    }
    for (int e = 0; e < 32; ++e) {
      const int k = e % 16 / 4, hi = e / 16, b = e % 4;
      if (!s.nibbles)  // u[k]: elements 4 k .. in lane j, 16 + 4 k .. in lane j + 4
        f(qs + e, 0, lv + 32 * k + 4 * (j + 4 * hi) + b, 0, 0xFF, 1);
      else  // u[k % 2] low nibbles, u[k % 2 + 2] high
        f(qs + e % 16, 4 * hi, lv + 32 * (k % 2) + 4 * (j + 4 * hi) + b, 4 * (k / 2), 0x0F, 1);
    }
  }
}

// Each piece of a row from one layout into the other: the file's into the CPU's (pack), or back.
void move_pieces(const char* what, bool pack, DType t, const uint8_t* src, uint8_t* dst,
                 int64_t n_in) {
  Shape s;
  KVS_CHECK(shape(t, s), what, ": ", dtype_name(t), " keeps the file's layout");
  std::memset(dst, 0, pack ? cpu_row_bytes(t, n_in) : row_bytes(t, n_in));
  each_piece(s, n_in, [&](size_t a, int as, size_t b, int bs, int mask, int n) {
    if (!pack) std::swap(a, b), std::swap(as, bs);  // a: where src holds the piece
    if (n > 1) return void(std::memcpy(dst + b, src + a, static_cast<size_t>(n)));
    dst[b] = static_cast<uint8_t>(dst[b] | ((src[a] >> as) & mask) << bs);
  });
}

}  // namespace

bool cpu_repacked(DType t) {
  Shape s;
  return shape(t, s);
}

size_t cpu_row_bytes(DType t, int64_t n_in) {
  Shape s;
  if (!shape(t, s)) return row_bytes(t, n_in);
  const int64_t n_sub = n_in / QK, tail = n_sub % 8;
  return static_cast<size_t>(n_sub / 8) * s.group + (tail == 0 ? 0 : tail <= 4 ? s.half : s.group);
}

void pack_row(DType t, const uint8_t* src, uint8_t* dst, int64_t n_in) {
  move_pieces("pack_row", true, t, src, dst, n_in);
}

void unpack_row(DType t, const uint8_t* src, uint8_t* dst, int64_t n_in) {
  move_pieces("unpack_row", false, t, src, dst, n_in);
}

void quantize_x(const float* x, int64_t n_tok, int64_t n, XGroup* xq) {
  KVS_CHECK(n % QK == 0, "quantize_x: ", n, " activations is not a whole number of blocks of 32");
  const int64_t nb = n / QK, ng = x_groups(n);
  thread_pool().parallel_for(n_tok * ng, 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t t = i / ng, g = i % ng;
      XGroup& xg = xq[i];
      const int valid = static_cast<int>(std::min<int64_t>(8, nb - 8 * g));
      if (valid < 8) std::memset(&xg, 0, sizeof xg);  // the blocks past the end: zeros
      const bool half = half_group(g, nb);
      for (int j = 0; j < valid; ++j) quantize_block(x + t * n + (8 * g + j) * QK, xg, j, half);
    }
  });
}

void int_matmul_rows(const Matrix& w, const XGroup* xq, int64_t n_tok, int64_t r0, int64_t nr,
                     float* y, int64_t ldy, DotIsa isa) {
  switch (isa) {
    case DotIsa::Avx2:
      return rows_avx2(w, xq, n_tok, r0, nr, y, ldy);
    case DotIsa::AvxVnni:
      return rows_avxvnni(w, xq, n_tok, r0, nr, y, ldy);
    case DotIsa::Avx512Vnni:
#ifdef KVS_HAVE_AVX512_KERNELS
      return rows_avx512(w, xq, n_tok, r0, nr, y, ldy);
#else
      return cpu_has(DotIsa::AvxVnni) ? rows_avxvnni(w, xq, n_tok, r0, nr, y, ldy)
                                      : rows_avx2(w, xq, n_tok, r0, nr, y, ldy);
#endif
  }
}

}  // namespace kvs::cpu
