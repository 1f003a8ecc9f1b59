// AVX2 helpers shared by the dequantize and dot kernels. Quantized levels are widened to one
// int32 lane per element, 8 elements per vector, straight from memory (vpmovzxbd m64): that keeps
// shuffles, the scarce port, to one per 8 bytes; the nibble and bit work is plain ALU.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kvs/quant/blocks.h"

namespace kvs::quant {

// The largest of v's eight lanes.
inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline __m128i load16(const void* p) {
  return _mm_loadu_si128(static_cast<const __m128i*>(p));
}
inline uint32_t load_u32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
// 8 bytes -> 8 int32 lanes.
inline __m256i u8_lanes(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline __m256i i8_lanes(const int8_t* p) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 to_ps(__m256i v) {
  return _mm256_cvtepi32_ps(v);
}
inline __m256i low4(__m256i v) {
  return _mm256_and_si256(v, _mm256_set1_epi32(0x0F));
}
inline __m256i high4(__m256i v) {
  return _mm256_srli_epi32(v, 4);
}  // v < 256

// A block's f16 scale (or min) in every lane.
inline __m256 bcast_f16(const uint8_t* p) {
  return _mm256_set1_ps(load_f16(p));
}

// The levels of a 4-bit 32-block (qs: element j in the low nibble of byte j, j + 16 in the high
// one) minus off, as 4 vectors of 8 in element order.
inline void q4_levels(const uint8_t* qs, __m256i off, __m256i q[4]) {
  const __m256i v0 = u8_lanes(qs), v1 = u8_lanes(qs + 8);
  q[0] = _mm256_sub_epi32(low4(v0), off);
  q[1] = _mm256_sub_epi32(low4(v1), off);
  q[2] = _mm256_sub_epi32(high4(v0), off);
  q[3] = _mm256_sub_epi32(high4(v1), off);
}

// The fifth bits of elements e0 .. e0+7 of a q5_0/q5_1 block (qh broadcast), as 0x10 per lane.
template <int e0>
inline __m256i q5_bit4(__m256i qh) {
  const __m256i shift =
      _mm256_setr_epi32(e0, e0 + 1, e0 + 2, e0 + 3, e0 + 4, e0 + 5, e0 + 6, e0 + 7);
  const __m256i bit = _mm256_and_si256(_mm256_srlv_epi32(qh, shift), _mm256_set1_epi32(1));
  return _mm256_slli_epi32(bit, 4);
}

// The 32 five-bit levels of a q5 block as 4 vectors of 8, in element order.
inline void q5_levels(const uint8_t* qs, const uint8_t* qhp, __m256i q[4]) {
  const __m256i qh = _mm256_set1_epi32(static_cast<int>(load_u32(qhp)));
  const __m256i v0 = u8_lanes(qs), v1 = u8_lanes(qs + 8);
  q[0] = _mm256_or_si256(low4(v0), q5_bit4<0>(qh));
  q[1] = _mm256_or_si256(low4(v1), q5_bit4<8>(qh));
  q[2] = _mm256_or_si256(high4(v0), q5_bit4<16>(qh));
  q[3] = _mm256_or_si256(high4(v1), q5_bit4<24>(qh));
}

// Group g of a q6_k half (128 elements): q[k] = levels of elements 32k + 8g .. 32k + 8g + 7,
// minus 32. Group k takes 4 bits from ql (low or high nibble) and bits 2k, 2k+1 of qh.
inline void q6_lanes(const uint8_t* ql, const uint8_t* qh, int g, __m256i q[4]) {
  const __m256i a = u8_lanes(ql + 8 * g), b = u8_lanes(ql + 32 + 8 * g);
  const __m256i h = u8_lanes(qh + 8 * g);
  const __m256i two = _mm256_set1_epi32(0x30), off = _mm256_set1_epi32(32);
  q[0] = _mm256_or_si256(low4(a), _mm256_and_si256(_mm256_slli_epi32(h, 4), two));
  q[1] = _mm256_or_si256(low4(b), _mm256_and_si256(_mm256_slli_epi32(h, 2), two));
  q[2] = _mm256_or_si256(high4(a), _mm256_and_si256(h, two));
  q[3] = _mm256_or_si256(high4(b), _mm256_and_si256(_mm256_srli_epi32(h, 2), two));
  for (int k = 0; k < 4; ++k) q[k] = _mm256_sub_epi32(q[k], off);
}

// The levels (kIq4nlValues) of a 32-block of iq4 nibbles, packed as in q4_0, as 4 vectors of 8
// in element order: one byte shuffle looks up 16 nibbles.
inline void iq4_levels(const uint8_t* qs, __m256i q[4]) {
  const __m128i table = load16(kIq4nlValues), m = _mm_set1_epi8(0x0F);
  const __m128i v = load16(qs);
  const __m128i lo = _mm_shuffle_epi8(table, _mm_and_si128(v, m));
  const __m128i hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(v, 4), m));
  q[0] = _mm256_cvtepi8_epi32(lo);
  q[1] = _mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8));
  q[2] = _mm256_cvtepi8_epi32(hi);
  q[3] = _mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8));
}

// Group g (elements 8g .. 8g+7) of lane group k of half h of a q2_k/q3_k super-block: the two
// bits at 2k of qs[32h + 8g ..] (the block's qs).
inline __m256i q2_bits(const uint8_t* qs, int h, int k, int g) {
  const __m256i v = _mm256_srl_epi32(u8_lanes(qs + 32 * h + 8 * g), _mm_cvtsi32_si128(2 * k));
  return _mm256_and_si256(v, _mm256_set1_epi32(3));
}
// The same elements of a q3_k super-block as levels -4..3: the high bit is bit 4h + k of hmask.
inline __m256i q3_levels(const BlockQ3_K& b, int h, int k, int g) {
  const __m256i m = _mm256_srl_epi32(u8_lanes(b.hmask + 8 * g), _mm_cvtsi32_si128(4 * h + k));
  const __m256i hi = _mm256_slli_epi32(_mm256_and_si256(m, _mm256_set1_epi32(1)), 2);
  return _mm256_sub_epi32(_mm256_or_si256(q2_bits(b.qs, h, k, g), hi), _mm256_set1_epi32(4));
}

// e^x: Cephes' expf, 2^n e^r with |r| <= ln 2 / 2 (ln 2 in two parts, n ln 2 exact) and a
// polynomial of degree 7 in r, within 2 ulp; 0 below -87.3 (e^-inf = 0), inf above 88.7.
inline __m256 exp_ps(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33654f);
  const __m256 live = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.7f));
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
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), live);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace kvs::quant
