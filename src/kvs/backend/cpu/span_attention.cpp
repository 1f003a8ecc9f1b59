#include "kvs/backend/cpu/span_attention.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

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

// acc[g] = the 8 lanes of head g's sum against one key's K slice k (d values): f32 products of
// q for f16 keys; for quantized keys, per block of 32 the exact integer sum of q16 x levels in
// each lane (4 products), converted and scaled by the key block's scale times q's step.
template <class I, DType K, int G>
inline void key_sums(const float* q, const int16_t* q16, const float* step, int32_t d,
                     const uint8_t* k, __m256* acc) {
  for (int g = 0; g < G; ++g) acc[g] = _mm256_setzero_ps();
  if constexpr (K == DType::F16) {
    for (int32_t i = 0; i < d; i += 8) {
      const __m256 kv = _mm256_cvtph_ps(quant::load16(k + 2 * i));
      for (int g = 0; g < G; ++g)
        acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * d + i), kv, acc[g]);
    }
  } else {
    const int32_t nb = d / 32, sb = query_blocks(d);
    // sc[g][b]: the key's scale of block b times head g's step there. The scales are read 8 at
    // a time from the slice's start (within it: it holds 34 or 18 bytes a block); lanes past
    // nb are not used.
    alignas(32) float sc[G][16];
    for (int32_t b = 0; b < nb; b += 8) {
      const __m256 dk = _mm256_cvtph_ps(quant::load16(k + 2 * b));
      for (int g = 0; g < G; ++g)
        _mm256_store_ps(sc[g] + b, _mm256_mul_ps(dk, _mm256_loadu_ps(step + g * sb + b)));
    }
    const uint8_t* qs = k + 2 * nb;
    for (int32_t b = 0; b < nb; ++b) {
      __m256i k0, k1;  // levels of elements 0-15 and 16-31 of the block
      if constexpr (K == DType::Q8_0) {
        k0 = _mm256_cvtepi8_epi16(quant::load16(qs + 32 * b));
        k1 = _mm256_cvtepi8_epi16(quant::load16(qs + 32 * b + 16));
      } else {
        const __m128i raw = quant::load16(qs + 16 * b), m = _mm_set1_epi8(0x0F),
                      eight = _mm_set1_epi8(8);
        k0 = _mm256_cvtepi8_epi16(_mm_sub_epi8(_mm_and_si128(raw, m), eight));
        k1 = _mm256_cvtepi8_epi16(_mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), m), eight));
      }
      for (int g = 0; g < G; ++g) {
        const int16_t* qb = q16 + g * d + 32 * b;
        const __m256i s = I::dot(I::dot(_mm256_setzero_si256(), k0, load256(qb)), k1,
                                 load256(qb + 16));
        acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_broadcast_ss(sc[g] + b), acc[g]);
      }
    }
  }
}

// Scores of G heads against keys [0, n): kp keys a step, so that the step's G kp lane sums
// take one lane_sums (kp G <= 8; the unused vectors are zero).
template <class I, DType K, int G>
void scores(const float* q, const int16_t* q16, const float* step, float scale, int32_t d,
            const uint8_t* k, size_t k_row, int32_t n, float* s, int64_t ld) {
  constexpr int kp = G >= 8 ? 1 : 8 / G;
  __m256 acc[8];
  alignas(32) float sums[8];
  const auto keys = [&](int32_t j, int kn) {
    for (int kk = 0; kk < kn; ++kk)
      key_sums<I, K, G>(q, q16, step, d, k + (j + kk) * k_row, acc + kk * G);
    for (int i = kn * G; i < 8; ++i) acc[i] = _mm256_setzero_ps();
    _mm256_store_ps(sums, lane_sums(acc));
    for (int kk = 0; kk < kn; ++kk)
      for (int g = 0; g < G; ++g) s[g * ld + j + kk] = sums[kk * G + g] * scale;
  };
  int32_t j = 0;
  for (; j + kp <= n; j += kp) keys(j, kp);
  if (j < n) keys(j, n - j);
}

// One entry per instruction set, the kernel inlined into it, compiled for it.
template <DType K, int G>
void scores_avx2(const float* q, const int16_t* q16, const float* step, float scale, int32_t d,
                 const uint8_t* k, size_t k_row, int32_t n, float* s, int64_t ld) {
  scores<Avx2, K, G>(q, q16, step, scale, d, k, k_row, n, s, ld);
}
template <DType K, int G>
[[gnu::target("avxvnni"), gnu::flatten]] void scores_avxvnni(
    const float* q, const int16_t* q16, const float* step, float scale, int32_t d,
    const uint8_t* k, size_t k_row, int32_t n, float* s, int64_t ld) {
  scores<AvxVnni, K, G>(q, q16, step, scale, d, k, k_row, n, s, ld);
}
template <DType K, int G>
[[gnu::target("avx512vnni,avx512vl"), gnu::flatten]] void scores_avx512vnni(
    const float* q, const int16_t* q16, const float* step, float scale, int32_t d,
    const uint8_t* k, size_t k_row, int32_t n, float* s, int64_t ld) {
  scores<Avx512Vnni, K, G>(q, q16, step, scale, d, k, k_row, n, s, ld);
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

// ---- values ----

template <DType V>
void v_rows(const uint8_t* v, size_t v_row, int32_t n, int32_t d, float* out) {
  const int32_t nb = d / 32;
  for (int32_t j = 0; j < n; ++j, v += v_row, out += d) {
    if constexpr (V == DType::F16) {
      for (int32_t i = 0; i < d; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(quant::load16(v + 2 * i)));
    } else {
      const uint8_t* qs = v + 2 * nb;
      for (int32_t b = 0; b < nb; ++b) {
        const __m256 scale = quant::bcast_f16(v + 2 * b);
        __m256i lv[4];
        if constexpr (V == DType::Q8_0) {
          for (int c = 0; c < 4; ++c)
            lv[c] = quant::i8_lanes(reinterpret_cast<const int8_t*>(qs) + 32 * b + 8 * c);
        } else {
          quant::q4_levels(qs + 16 * b, _mm256_set1_epi32(8), lv);
        }
        for (int c = 0; c < 4; ++c)
          _mm256_storeu_ps(out + 32 * b + 8 * c, _mm256_mul_ps(scale, quant::to_ps(lv[c])));
      }
    }
  }
}

// e^x for x <= 0, 0 below -87.3 (e^-inf = 0): Cephes' expf (2^n e^r, |r| <= ln 2 / 2, a
// polynomial of degree 7 in r), within 2 ulp.
inline __m256 exp_le0(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33654f);
  const __m256 live = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
  x = _mm256_max_ps(x, lo);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r);
  y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), live);
}

// p[0 .. n8) (n8 a multiple of 8, the scores past n -inf) -> e^(p - m) with m their max;
// returns m and the sum of the e^, 8 lanes summed in order then across (hsum).
inline void softmax(float* p, int32_t n8, float& m, float& l) {
  __m256 mv = _mm256_set1_ps(-INFINITY);
  for (int32_t j = 0; j < n8; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(p + j));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  m = _mm_cvtss_f32(m4);
  const __m256 mb = _mm256_set1_ps(m);
  __m256 sum = _mm256_setzero_ps();
  for (int32_t j = 0; j < n8; j += 8) {
    const __m256 e = exp_le0(_mm256_sub_ps(_mm256_loadu_ps(p + j), mb));
    _mm256_storeu_ps(p + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  l = hsum(sum);
}

// o[g * os + i] = fma(p[g * ld + j], vf[j d + i], o[g * os + i]) for the keys j < n in order:
// each element's chain of fmas in key order, kG heads x kC vectors of 8 dimensions at a time.
template <int kG, int kC>
inline void accumulate_tile(float* o, size_t os, const float* p, int64_t ld, const float* vf,
                            int32_t d, int32_t n) {
  __m256 acc[kG][kC];
  for (int g = 0; g < kG; ++g)
    for (int c = 0; c < kC; ++c) acc[g][c] = _mm256_loadu_ps(o + g * os + 8 * c);
  for (int32_t j = 0; j < n; ++j) {
    __m256 v[kC];
    for (int c = 0; c < kC; ++c) v[c] = _mm256_loadu_ps(vf + static_cast<int64_t>(j) * d + 8 * c);
    for (int g = 0; g < kG; ++g) {
      const __m256 pj = _mm256_broadcast_ss(p + g * ld + j);
      for (int c = 0; c < kC; ++c) acc[g][c] = _mm256_fmadd_ps(pj, v[c], acc[g][c]);
    }
  }
  for (int g = 0; g < kG; ++g)
    for (int c = 0; c < kC; ++c) _mm256_storeu_ps(o + g * os + 8 * c, acc[g][c]);
}

void accumulate(float* o, size_t os, const float* p, int64_t ld, const float* vf, int32_t d,
                int32_t n, int32_t group) {
  for (int32_t i = 0; i < d; i += 32) {
    int32_t g = 0;
    for (; g + 2 <= group; g += 2)
      accumulate_tile<2, 4>(o + g * os + i, os, p + g * ld, ld, vf + i, d, n);
    if (g < group) accumulate_tile<1, 4>(o + g * os + i, os, p + g * ld, ld, vf + i, d, n);
  }
}

constexpr int32_t kVPiece = 64;  // V rows dequantized at a time when not given: within L1

int64_t round8(int32_t n) {
  return (static_cast<int64_t>(n) + 7) / 8 * 8;
}

}  // namespace

void prepare_query(DType k_type, const float* q, int32_t n_head, int32_t d, int16_t* q16,
                   float* step) {
  if (k_type == DType::F16) return;
  const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const int32_t nb = d / 32, sb = query_blocks(d);
  for (int32_t h = 0; h < n_head; ++h)
    for (int32_t b = 0; b < nb; ++b) {
      const float* x = q + static_cast<int64_t>(h) * d + 32 * b;
      int16_t* y = q16 + static_cast<int64_t>(h) * d + 32 * b;
      __m256 mv = _mm256_setzero_ps();
      for (int c = 0; c < 4; ++c) mv = _mm256_max_ps(mv, _mm256_and_ps(_mm256_loadu_ps(x + 8 * c), abs));
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
      ks.v_rows = v_rows<DType::F16>;
      break;
    case DType::Q8_0:
      ks.v_rows = v_rows<DType::Q8_0>;
      break;
    case DType::Q4_0:
      ks.v_rows = v_rows<DType::Q4_0>;
      break;
    default:
      fail("cpu attention: V cache type ", dtype_name(v_type), " (f16, q8_0, q4_0)");
  }
  return ks;
}

size_t span_scratch(const SpanKernels& ks, int32_t n) {
  return static_cast<size_t>(ks.group * round8(n) + int64_t{kVPiece} * ks.d);
}

void span_partials(const SpanKernels& ks, const Query& q, int32_t h0, const HeadRows& r,
                   const float* vf, float* scratch, float* out) {
  const int32_t G = ks.group, d = ks.d, n = r.n;
  const size_t os = part_stride(d);
  if (n <= 0) {
    for (int32_t g = 0; g < G; ++g) out[g * os + 2] = 0.0f;
    return;
  }
  const int64_t ld = round8(n);
  float* p = scratch;  // [G][ld]: the scores, then the probabilities
  const int64_t off = static_cast<int64_t>(h0) * d;
  const bool ints = q.q16 != nullptr;  // null for f16 keys
  ks.scores(q.q + off, ints ? q.q16 + off : nullptr,
            ints ? q.step + static_cast<int64_t>(h0) * query_blocks(d) : nullptr, ks.scale, d, r.k,
            r.k_row, n, p, ld);
  for (int32_t g = 0; g < G; ++g) {
    float* pg = p + g * ld;
    std::fill(pg + n, pg + ld, -INFINITY);
    float* o = out + g * os;
    softmax(pg, static_cast<int32_t>(ld), o[0], o[1]);
    o[2] = 1.0f;
    o[3] = 0.0f;
    std::fill(o + kPartHead, o + os, 0.0f);
  }
  if (vf) {
    accumulate(out + kPartHead, os, p, ld, vf, d, n, G);
    return;
  }
  float* tile = p + G * ld;  // [kVPiece][d]
  for (int32_t j = 0; j < n; j += kVPiece) {
    const int32_t m = std::min(kVPiece, n - j);
    ks.v_rows(r.v + static_cast<size_t>(j) * r.v_row, r.v_row, m, d, tile);
    accumulate(out + kPartHead, os, p + j, ld, tile, d, m, G);
  }
}

}  // namespace kvs::cpu
