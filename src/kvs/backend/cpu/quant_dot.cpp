#include "kvs/backend/cpu/quant_dot.h"

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

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

// y[t ldy + r] for R rows (w, ld bytes apart) and T tokens (x, np pairs apart), n_units units a
// row. Per output and pair of sub-blocks, in order: lanes h and l = dot(offset, u, plane),
// acc = fma(float(254 h + l), dw dx, acc), with kMin acc = fma(min, s4, acc); the result is the
// 16 lanes' sum. Every tile shape performs exactly this sequence, so the shapes agree. The
// unsigned levels are below 64 after their offset, so each lane of h is at most 4 x 32 x 127:
// within int16 (combine's kNarrow).
template <class F, class I, int R, int T>
[[gnu::always_inline]] inline void tile(const uint8_t* w, size_t ld, const XPair* x, int64_t np,
                                        int64_t n_units, int64_t n_sub, float* y, int64_t ldy) {
  using VI = typename I::VI;
  using VF = typename I::VF;
  constexpr int kShift = F::kSigned ? 7 : F::kShift;  // signed levels + 128: unsigned bytes
  VF acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = I::zerof();
  for (int64_t b = 0; b < n_units; ++b) {
    typename F::Scales sc[R];
    const bool two = (b + 1) * F::kSubs <= n_sub;
    for (int r = 0; r < R; ++r) F::scales(w + r * ld + b * F::kUnitBytes, two, sc[r]);
    for (int q = 0; q < F::kSubs / 2; ++q) {
      const int64_t p = b * (F::kSubs / 2) + q;
      VI xh[T], xl[T], oh[T], ol[T];
      for (int t = 0; t < T; ++t) {
        xh[t] = I::load(x[t * np + p].h);
        xl[t] = I::load(x[t * np + p].l);
        if constexpr (kShift > 0) {
          oh[t] = I::offset(xh[t], kShift);
          ol[t] = I::offset(xl[t], kShift);
        } else {
          oh[t] = ol[t] = I::zero();
        }
      }
      for (int r = 0; r < R; ++r) {
        VI u = F::template levels<I>(sc[r], q);
        const VF dw = F::template scale<I>(sc[r], q);
        const VF mw = F::kMin ? F::template min<I>(sc[r], q) : I::zerof();
        VI ua = u;
        if constexpr (F::kSigned) ua = I::xor80(u);
        for (int t = 0; t < T; ++t) {
          const VI lh = I::dot(oh[t], ua, xh[t]), ll = I::dot(ol[t], ua, xl[t]);
          const VF s = I::mul(dw, I::loadf(x[t * np + p].d));
          acc[r][t] = I::fma(I::cvt(I::template combine<!F::kSigned>(lh, ll)), s, acc[r][t]);
          if constexpr (F::kMin) acc[r][t] = I::fma(mw, I::loadf(x[t * np + p].s4), acc[r][t]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) y[t * ldy + r] = I::sum(acc[r][t]);
}

// Tiles of kRows x kToks (each weight unit unpacked once for kToks tokens), then the leftover
// rows and tokens (kRows1 rows at a time for one token).
template <class F, class I>
[[gnu::always_inline]] inline void rows(const Matrix& w, const XPair* x, int64_t n_tok, int64_t r0,
                                        int64_t nr, float* y, int64_t ldy) {
  constexpr int R = I::kRows, T = I::kToks, R1 = I::kRows1;
  const int64_t np = x_pairs(w.n_in), n_sub = w.n_in / QK;
  const int64_t n_units = (n_sub + F::kSubs - 1) / F::kSubs;
  const size_t ld = w.row_bytes;
  const uint8_t* w0 = w.row(r0);
  int64_t t = 0;
  for (; t + T <= n_tok; t += T) {
    int64_t r = 0;
    for (; r + R <= nr; r += R)
      tile<F, I, R, T>(w0 + r * ld, ld, x + t * np, np, n_units, n_sub, y + t * ldy + r, ldy);
    for (; r < nr; ++r)
      tile<F, I, 1, T>(w0 + r * ld, ld, x + t * np, np, n_units, n_sub, y + t * ldy + r, ldy);
  }
  for (; t < n_tok; ++t) {
    int64_t r = 0;
    for (; r + R1 <= nr; r += R1) {
      // The rows eight tiles on (past nr too: the next task's), asked of the caches now: one
      // token's tiles wait on memory, not on arithmetic.
      const uint8_t* next = w0 + (r + 8 * R1) * ld;
      for (size_t off = 0; off < R1 * ld; off += 64)
        _mm_prefetch(reinterpret_cast<const char*>(next + off), _MM_HINT_T0);
      tile<F, I, R1, 1>(w0 + r * ld, ld, x + t * np, np, n_units, n_sub, y + t * ldy + r, ldy);
    }
    for (; r < nr; ++r)
      tile<F, I, 1, 1>(w0 + r * ld, ld, x + t * np, np, n_units, n_sub, y + t * ldy + r, ldy);
  }
}

// ---- the 256-bit kernels: levels widened to int16 against 254 h + l ----
// The same lanes' integers as tile(), from one vpmaddwd (AVX2) or vpdpwssd (AVX-VNNI) per 16
// elements of a token where the bytes take four multiplies and a combine: a pair's 64 levels,
// bytes in element order as Avx2 unpacks them, are spread to int16 in XPair::v's order once
// per row and serve every token of the tile. Unsigned levels lose their offset here (the
// integers sum (u - 2^s)(254 h + l) are tile()'s 254 h.w + l.w), signed ones keep their sign.
template <bool kSigned, int kShift>
[[gnu::always_inline]] inline void widen(__m256i u, __m256i& a, __m256i& b) {
  constexpr char z = -1;  // pshufb: a zero byte
  if constexpr (kSigned) {  // each byte into its int16's high byte, then shifted down
    const __m256i ma = _mm256_setr_epi8(z, 0, z, 1, z, 4, z, 5, z, 8, z, 9, z, 12, z, 13, z, 0, z,
                                        1, z, 4, z, 5, z, 8, z, 9, z, 12, z, 13);
    const __m256i mb = _mm256_setr_epi8(z, 2, z, 3, z, 6, z, 7, z, 10, z, 11, z, 14, z, 15, z, 2,
                                        z, 3, z, 6, z, 7, z, 10, z, 11, z, 14, z, 15);
    a = _mm256_srai_epi16(_mm256_shuffle_epi8(u, ma), 8);
    b = _mm256_srai_epi16(_mm256_shuffle_epi8(u, mb), 8);
  } else {
    const __m256i ma = _mm256_setr_epi8(0, z, 1, z, 4, z, 5, z, 8, z, 9, z, 12, z, 13, z, 0, z, 1,
                                        z, 4, z, 5, z, 8, z, 9, z, 12, z, 13, z);
    const __m256i mb = _mm256_setr_epi8(2, z, 3, z, 6, z, 7, z, 10, z, 11, z, 14, z, 15, z, 2, z,
                                        3, z, 6, z, 7, z, 10, z, 11, z, 14, z, 15, z);
    a = _mm256_shuffle_epi8(u, ma);
    b = _mm256_shuffle_epi8(u, mb);
    if constexpr (kShift > 0) {
      a = _mm256_sub_epi16(a, _mm256_set1_epi16(1 << kShift));
      b = _mm256_sub_epi16(b, _mm256_set1_epi16(1 << kShift));
    }
  }
}

struct Madd16 {
  static constexpr bool kInt16 = true;
  static __m256i dot(__m256i acc, __m256i a, __m256i v) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, v));
  }
};
struct Dpwssd16 {
  static constexpr bool kInt16 = true;
  [[gnu::target("avxvnni")]] static __m256i dot(__m256i acc, __m256i a, __m256i v) {
    return _mm256_dpwssd_avx_epi32(acc, a, v);
  }
};

// tile() for the 256-bit instruction sets: per output and pair the same integers, then the same
// float steps in the same order.
template <class F, class D, int R, int T>
[[gnu::always_inline]] inline void tile16(const uint8_t* w, size_t ld, const XPair* x, int64_t np,
                                          int64_t n_units, int64_t n_sub, float* y, int64_t ldy) {
  using I = Avx2;  // the bytes' unpacking and the scales
  constexpr int kShift = F::kSigned ? 0 : F::kShift;
  // Lanes 0 .. 7 (the pair's first block or sub-block) and 8 .. 15 apart, one half of a row's
  // levels widened at a time: 4 tokens' accumulators, the half's levels and scales fit the 16
  // registers without spilling.
  __m256 acc[R][T][2];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t][0] = acc[r][t][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_units; ++b) {
    typename F::Scales sc[R];
    const bool two = (b + 1) * F::kSubs <= n_sub;
    for (int r = 0; r < R; ++r) F::scales(w + r * ld + b * F::kUnitBytes, two, sc[r]);
    for (int q = 0; q < F::kSubs / 2; ++q) {
      const int64_t p = b * (F::kSubs / 2) + q;
      for (int r = 0; r < R; ++r) {
        const I::VI u = F::template levels<I>(sc[r], q);
        const I::VF dw = F::template scale<I>(sc[r], q);
        const I::VF mw = F::kMin ? F::template min<I>(sc[r], q) : I::zerof();
        for (int h = 0; h < 2; ++h) {
          __m256i lo, hi;
          widen<F::kSigned, kShift>(h == 0 ? u.a : u.b, lo, hi);
          const __m256 d = h == 0 ? dw.a : dw.b, m = h == 0 ? mw.a : mw.b;
          for (int t = 0; t < T; ++t) {
            const XPair& xp = x[t * np + p];
            const auto* v = reinterpret_cast<const __m256i*>(xp.v) + 2 * h;
            const __m256i lane = D::dot(D::dot(_mm256_setzero_si256(), lo, _mm256_load_si256(v)),
                                        hi, _mm256_load_si256(v + 1));
            const __m256 s = _mm256_mul_ps(d, _mm256_load_ps(xp.d + 8 * h));
            __m256& a = acc[r][t][h];
            a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lane), s, a);
            if constexpr (F::kMin) a = _mm256_fmadd_ps(m, _mm256_load_ps(xp.s4 + 8 * h), a);
          }
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) y[t * ldy + r] = hsum(_mm256_add_ps(acc[r][t][0], acc[r][t][1]));
}

// rows() for the 256-bit instruction sets: tiles of a row and 4 tokens (a verify step of 4, or
// prefill, unpacks each row once for the 4), the 1 to 3 tokens left in one tile, and a single
// token (decode) 2 rows at a time (4 spilled).
template <class F, class D>
[[gnu::always_inline]] inline void rows16(const Matrix& w, const XPair* x, int64_t n_tok,
                                          int64_t r0, int64_t nr, float* y, int64_t ldy) {
  const int64_t np = x_pairs(w.n_in), n_sub = w.n_in / QK;
  const int64_t n_units = (n_sub + F::kSubs - 1) / F::kSubs;
  const size_t ld = w.row_bytes;
  const uint8_t* w0 = w.row(r0);
  // A template, not a function pointer: the tile must inline into its instruction set's entry.
  const auto each_row = [&]<int T>(int64_t t) {
    for (int64_t r = 0; r < nr; ++r)
      tile16<F, D, 1, T>(w0 + r * ld, ld, x + t * np, np, n_units, n_sub, y + t * ldy + r, ldy);
  };
  int64_t t = 0;
  for (; t + 4 <= n_tok; t += 4) each_row.template operator()<4>(t);
  switch (n_tok - t) {
    case 3:
      return each_row.template operator()<3>(t);
    case 2:
      return each_row.template operator()<2>(t);
    case 1: {
      constexpr int R1 = 2;
      int64_t r = 0;
      for (; r + R1 <= nr; r += R1) {
        // The rows eight tiles on (past nr too: the next task's), asked of the caches now: one
        // token's tiles wait on memory, not on arithmetic.
        const uint8_t* next = w0 + (r + 8 * R1) * ld;
        for (size_t off = 0; off < R1 * ld; off += 64)
          _mm_prefetch(reinterpret_cast<const char*>(next + off), _MM_HINT_T0);
        tile16<F, D, R1, 1>(w0 + r * ld, ld, x + t * np, np, n_units, n_sub, y + t * ldy + r, ldy);
      }
      for (; r < nr; ++r)
        tile16<F, D, 1, 1>(w0 + r * ld, ld, x + t * np, np, n_units, n_sub, y + t * ldy + r, ldy);
      return;
    }
    default:
      return;
  }
}

// I: Madd16 or Dpwssd16 (the 256-bit kernels' products), or Avx512.
template <class F, class I>
[[gnu::always_inline]] inline void pick(const Matrix& w, const XPair* x, int64_t n_tok, int64_t r0,
                                        int64_t nr, float* y, int64_t ldy) {
  if constexpr (I::kInt16) {
    rows16<F, I>(w, x, n_tok, r0, nr, y, ldy);
  } else {
    // 2 to kToks - 1 tokens past the whole tiles (a verify step, a small batch) go to the
    // 256-bit kernel, which unpacks a row once for 4 of them where rows() would take them one
    // by one; its bits are the same.
    const int64_t whole = n_tok / I::kToks * I::kToks;
    if (n_tok - whole < 2) return rows<F, I>(w, x, n_tok, r0, nr, y, ldy);
    if (whole > 0) rows<F, I>(w, x, whole, r0, nr, y, ldy);
    rows16<F, typename I::Narrow>(w, x + whole * x_pairs(w.n_in), n_tok - whole, r0, nr,
                                  y + whole * ldy, ldy);
  }
}

template <class I>
[[gnu::always_inline]] inline void rows_of(const Matrix& w, const XPair* x, int64_t n_tok,
                                           int64_t r0, int64_t nr, float* y, int64_t ldy) {
  switch (w.type) {
    case DType::Q8_0:
      return pick<Pair<Q8_0>, I>(w, x, n_tok, r0, nr, y, ldy);
    case DType::Q4_0:
      return pick<Pair<Q4_0>, I>(w, x, n_tok, r0, nr, y, ldy);
    case DType::Q4_1:
      return pick<Pair<Q4_1>, I>(w, x, n_tok, r0, nr, y, ldy);
    case DType::Q5_0:
      return pick<Pair<Q5_0>, I>(w, x, n_tok, r0, nr, y, ldy);
    case DType::Q5_1:
      return pick<Pair<Q5_1>, I>(w, x, n_tok, r0, nr, y, ldy);
    case DType::IQ4_NL:
      return pick<Pair<IQ4_NL>, I>(w, x, n_tok, r0, nr, y, ldy);
    case DType::Q2_K:
      return pick<Q2_K, I>(w, x, n_tok, r0, nr, y, ldy);
    case DType::Q3_K:
      return pick<Q3_K, I>(w, x, n_tok, r0, nr, y, ldy);
    case DType::Q4_K:
      return pick<Q4_K, I>(w, x, n_tok, r0, nr, y, ldy);
    case DType::Q5_K:
      return pick<Q5_K, I>(w, x, n_tok, r0, nr, y, ldy);
    case DType::Q6_K:
      return pick<Q6_K, I>(w, x, n_tok, r0, nr, y, ldy);
    case DType::IQ4_XS:
      return pick<IQ4_XS, I>(w, x, n_tok, r0, nr, y, ldy);
    default:
      fail("int_matmul_rows: no integer kernel for ", dtype_name(w.type));
  }
}

// One entry per instruction set, compiled for it (the kernels are inlined into it).
void rows_avx2(const Matrix& w, const XPair* x, int64_t n_tok, int64_t r0, int64_t nr, float* y,
               int64_t ldy) {
  rows_of<Madd16>(w, x, n_tok, r0, nr, y, ldy);
}
[[gnu::target("avxvnni"), gnu::flatten]] void rows_avxvnni(const Matrix& w, const XPair* x,
                                                            int64_t n_tok, int64_t r0, int64_t nr,
                                                            float* y, int64_t ldy) {
  rows_of<Dpwssd16>(w, x, n_tok, r0, nr, y, ldy);
}
#ifdef KVS_HAVE_AVX512_KERNELS
[[KVS_AVX512, gnu::flatten]] void rows_avx512(const Matrix& w, const XPair* x, int64_t n_tok,
                                               int64_t r0, int64_t nr, float* y, int64_t ldy) {
  rows_of<Avx512>(w, x, n_tok, r0, nr, y, ldy);
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

void quantize_x(const float* x, int64_t n_tok, int64_t n, XPair* xq) {
  KVS_CHECK(n % QK == 0, "quantize_x: ", n, " activations is not a whole number of blocks of 32");
  const int64_t nb = n / QK, np = x_pairs(n);
  thread_pool().parallel_for(n_tok * np, 128, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t t = i / np, p = i % np;
      XPair& xp = xq[i];
      quantize_block(x + t * n + 2 * p * QK, xp, 0);
      if (2 * p + 1 < nb) {
        quantize_block(x + t * n + (2 * p + 1) * QK, xp, 1);
      } else {  // the odd last block's partner: zeros
        std::memset(xp.h + 32, 0, 32);
        std::memset(xp.l + 32, 0, 32);
        std::memset(xp.v + 32, 0, 64);
        std::fill(xp.d + 8, xp.d + 16, 0.0f);
        std::fill(xp.s4 + 8, xp.s4 + 16, 0.0f);
      }
    }
  });
}

void int_matmul_rows(const Matrix& w, const XPair* xq, int64_t n_tok, int64_t r0, int64_t nr,
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
