// AVX2 helpers shared by the dequantize and dot kernels: unpacking quantized blocks into 32 int8
// lanes (one lane per element, in element order) and widening them to floats.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace kvs::quant {

inline __m256i load32(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
inline __m128i load16(const void* p) {
  return _mm_loadu_si128(static_cast<const __m128i*>(p));
}
inline uint32_t load_u32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// 16 bytes of nibble pairs -> 32 lanes: the 16 low nibbles, then the 16 high nibbles.
inline __m256i nibbles16(const uint8_t* qs) {
  const __m128i b = load16(qs);
  const __m256i v = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

// Lane i = 0x10 where bit i of x is set, else 0 (the fifth bit of q5_0/q5_1 elements).
inline __m256i bit4_from_bits(uint32_t x) {
  const __m256i shuf =
      _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(x)), shuf);
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

// Lanes 8k .. 8k+7 of 32 int8 lanes as floats (exact).
template <int k>
inline __m256 lanes_ps(__m256i v) {
  const __m128i h = k < 2 ? _mm256_castsi256_si128(v) : _mm256_extracti128_si256(v, 1);
  const __m128i g = k % 2 == 0 ? h : _mm_unpackhi_epi64(h, h);
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(g));
}

// The four groups of 32 six-bit levels of a q6_k half (128 elements), minus 32, as int8. Group k
// takes 4 bits from ql and bits 2k, 2k+1 of qh (moved to bits 4, 5 by 16-bit shifts; the mask
// drops what spills from the neighbouring byte).
inline void q6_half(const uint8_t* ql, const uint8_t* qh, __m256i q[4]) {
  const __m256i low = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(0x30);
  const __m256i l0 = load32(ql), l1 = load32(ql + 32), h = load32(qh);
  const __m256i hi0 = _mm256_and_si256(_mm256_srli_epi16(l0, 4), low);
  const __m256i hi1 = _mm256_and_si256(_mm256_srli_epi16(l1, 4), low);
  q[0] = _mm256_or_si256(_mm256_and_si256(l0, low), _mm256_and_si256(_mm256_slli_epi16(h, 4), two));
  q[1] = _mm256_or_si256(_mm256_and_si256(l1, low), _mm256_and_si256(_mm256_slli_epi16(h, 2), two));
  q[2] = _mm256_or_si256(hi0, _mm256_and_si256(h, two));
  q[3] = _mm256_or_si256(hi1, _mm256_and_si256(_mm256_srli_epi16(h, 2), two));
  const __m256i off = _mm256_set1_epi8(32);
  for (int k = 0; k < 4; ++k) q[k] = _mm256_sub_epi8(q[k], off);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace kvs::quant
