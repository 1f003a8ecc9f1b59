// What quant_dot.cpp's kernels are made of: the activations quantized into XGroups, and each
// weight format's group of eight sub-blocks read as level bytes, dword k of sub-block j in lane j
// (the order of XGroup::v), with the sub-blocks' scales and mins as float lanes. Included by
// quant_dot.cpp alone.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvs/backend/cpu/quant_dot.h"
#include "kvs/quant/blocks.h"
#include "kvs/quant/simd.h"

namespace kvs::cpu::lanes {

using namespace quant;

// ---- activations ----

inline int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// Block j of g from the 32 floats at x: quantize_x_block of the CUDA backend (common.cuh), with
// the same correctly rounded division, reciprocal, products and rint.
inline void quantize_block(const float* x, XGroup& g, int j, bool half) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4], amax = _mm256_setzero_ps();
  for (int c = 0; c < 4; ++c) {
    v[c] = _mm256_loadu_ps(x + 8 * c);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[c]));
  }
  const float dx = hmax(amax) / 127.0f;
  const __m256 id = _mm256_set1_ps(dx != 0.0f ? 1.0f / dx : 0.0f);
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m256i k254 = _mm256_set1_epi32(254);
  __m256i hl[4];
  for (int c = 0; c < 4; ++c) {
    const __m256 s = _mm256_mul_ps(v[c], id), hf = _mm256_round_ps(s, kRound);
    const __m256 lf =
        _mm256_round_ps(_mm256_mul_ps(_mm256_sub_ps(s, hf), _mm256_set1_ps(254.0f)), kRound);
    // 254 h + l: the madd reads h's low int16 (the high one is its sign) against 254 and 0.
    hl[c] =
        _mm256_add_epi32(_mm256_madd_epi16(_mm256_cvtps_epi32(hf), k254), _mm256_cvtps_epi32(lf));
  }
  alignas(32) int32_t e[32];
  for (int c = 0; c < 4; ++c) _mm256_store_si256(reinterpret_cast<__m256i*>(e + 8 * c), hl[c]);
  for (int i = 0; i < 32; ++i)
    g.v[half ? v_half_index(j, i) : v_index(j, i)] = static_cast<int16_t>(e[i]);
  const int lo = hsum_i32(_mm256_add_epi32(hl[0], hl[1]));
  const int hi = hsum_i32(_mm256_add_epi32(hl[2], hl[3]));
  const int sums[3] = {lo + hi, lo, hi};
  for (int k = 0; k < 3; ++k) {
    g.nsum[k][j] = -sums[k];
    g.s[k][j] = dx * (static_cast<float>(sums[k]) / 254.0f);  // exact numerator
  }
  g.d[j] = dx / 254.0f;
}

// ---- helpers ----

inline __m256i load32(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
inline __m256i bytes(int v) {
  return _mm256_set1_epi8(static_cast<char>(v));
}
// The 16 bytes at lo in the low half, those at hi in the high.
[[gnu::always_inline]] inline __m256i load2x16(const uint8_t* lo, const uint8_t* hi) {
  return _mm256_inserti128_si256(_mm256_castsi128_si256(load16(lo)), load16(hi), 1);
}
// The dword at lo in lanes 0 .. 3, the one at hi in 4 .. 7.
[[gnu::always_inline]] inline __m256i dword2x4(const uint8_t* lo, const uint8_t* hi) {
  return _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_set1_epi32(static_cast<int>(load_u32(lo)))),
      _mm_set1_epi32(static_cast<int>(load_u32(hi))), 1);
}
// z[c] = dword c of y[0], y[1], y[2], y[3] in lanes 0 .. 3, and of their high halves in 4 .. 7.
[[gnu::always_inline]] inline void transpose4(const __m256i y[4], __m256i z[4]) {
  const __m256i t0 = _mm256_unpacklo_epi32(y[0], y[1]), t1 = _mm256_unpackhi_epi32(y[0], y[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(y[2], y[3]), t3 = _mm256_unpackhi_epi32(y[2], y[3]);
  z[0] = _mm256_unpacklo_epi64(t0, t2);
  z[1] = _mm256_unpackhi_epi64(t0, t2);
  z[2] = _mm256_unpacklo_epi64(t1, t3);
  z[3] = _mm256_unpackhi_epi64(t1, t3);
}
// Levels packed as in q4_0 (element i in the low nibble of byte i, i + 16 in the high) at
// p + j stride, j = 0 .. 7: u[k] holds dword k of sub-block j's 32 levels in lane j.
[[gnu::always_inline]] inline void nibble_levels(const uint8_t* p, size_t stride, __m256i u[8]) {
  __m256i y[4], z[4];
  for (int j = 0; j < 4; ++j) y[j] = load2x16(p + j * stride, p + (j + 4) * stride);
  transpose4(y, z);
  for (int c = 0; c < 4; ++c) {
    u[c] = _mm256_and_si256(z[c], bytes(0x0F));
    u[4 + c] = _mm256_and_si256(_mm256_srli_epi16(z[c], 4), bytes(0x0F));
  }
}
// `set` in byte i of lane j where bit j of byte i of the dword broadcast in v is set (the
// super-blocks' high bits, one bit per sub-block).
[[gnu::always_inline]] inline __m256i bit_of_lane(__m256i v, int set) {
  const __m256i m = _mm256_setr_epi32(0x01010101, 0x02020202, 0x04040404, 0x08080808, 0x10101010,
                                      0x20202020, 0x40404040, static_cast<int>(0x80808080));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, m), m), bytes(set));
}

// ---- weight formats ----
// F::group() reads group g (sub-blocks 8 g .. 8 g + 7) of a row: u[k] holds dword k of each
// sub-block's 32 level bytes (elements 4 k .. 4 k + 3) in lane j, unsigned (the weight is
// d (level - 2^kShift), or with kMin d level + min) or signed (kSigned: d level); the scales
// per lane, with k16 those of the first 16 elements in d and of the last 16 in dh (the mins
// alike in m and mh).

struct Scales {
  __m256 d, m, dh, mh;
};

// The 32-element formats, in the CPU layout of pack_row() (quant_dot.h): a row's groups of
// 8 blocks each hold the blocks' f16 scales d[8], their f16 mins m[8] (kMin), q5's fifth bits
// (kQh: 8 dwords, block j's in lane j) and the level bytes as the kernels read them (B::levels);
// a row's last group of at most 4 blocks is a half group (half_group(), v_half_index): d[4],
// m[4], the fifth bits with lanes 4 .. 7 again blocks 0 .. 3, and half the level bytes. The
// blocks past a row's end are zeros.
template <class B>
struct Blocks : B {
  static constexpr bool k16 = false, kHalves = true;
  static constexpr size_t kScales = B::kMin ? 4 : 2;  // bytes per block before the qh and levels
  static constexpr size_t kQhBytes = B::kQh ? 32 : 0, kLevels = B::kNibbles ? 128 : 256;
  static constexpr size_t kGroup = 8 * kScales + kQhBytes + kLevels;
  static constexpr size_t kHalfGroup = 4 * kScales + kQhBytes + kLevels / 2;
  [[gnu::always_inline]] static void group(const uint8_t* row, int64_t g, int64_t, Scales& s,
                                           __m256i u[8]) {
    const uint8_t* p = row + g * kGroup;
    s.d = _mm256_cvtph_ps(load16(p));
    if constexpr (B::kMin) s.m = _mm256_cvtph_ps(load16(p + 16));
    B::template levels<false>(p + 8 * kScales, u);
  }
  [[gnu::always_inline]] static void half_group(const uint8_t* row, int64_t g, int64_t, Scales& s,
                                                __m256i u[4]) {
    const uint8_t* p = row + g * kGroup;
    const auto half = [](const uint8_t* q) {  // 4 f16 in lanes 0 .. 3, zeros above
      return _mm256_zextps128_ps256(
          _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
    };
    s.d = half(p);
    if constexpr (B::kMin) s.m = half(p + 8);
    B::template levels<true>(p + 4 * kScales, u);
  }
};
// A group's levels (elements 4 k .. 4 k + 3 of block j in lane j of u[k]) from 4 vectors of
// nibble pairs, u[c] low and u[c + 4] high; a half group's (v_half_index) from 2, u[c] and
// u[c + 2].
template <bool kHalf>
[[gnu::always_inline]] inline void cpu_nibbles(const uint8_t* q, __m256i* u) {
  constexpr int n = kHalf ? 2 : 4;
  for (int c = 0; c < n; ++c) {
    const __m256i w = load32(q + 32 * c);
    u[c] = _mm256_and_si256(w, bytes(0x0F));
    u[c + n] = _mm256_and_si256(_mm256_srli_epi16(w, 4), bytes(0x0F));
  }
}
// Or 0x10 into the levels (a group's or, with kHalf, a half group's) where the bits of qh
// (lane j: block j's 32 bits, bit i for element i) are set.
template <bool kHalf>
[[gnu::always_inline]] inline void fifth_bits(__m256i qh, __m256i u[8]) {
  const __m256i lane = _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12, 0, 0, 0,
                                        0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
  for (int k = 0; k < (kHalf ? 4 : 8); ++k) {
    // Elements 4k .. 4k + 3 (and 16 + 4k .. in a half group's lanes 4 .. 7): byte k / 2
    // (2 + k / 2) of the lane's 32 bits.
    const __m256i byte = kHalf ? _mm256_setr_m128i(_mm_set1_epi8(static_cast<char>(k / 2)),
                                                   _mm_set1_epi8(static_cast<char>(2 + k / 2)))
                               : bytes(k / 2);
    const __m256i v = _mm256_shuffle_epi8(qh, _mm256_add_epi8(lane, byte));
    const __m256i bit = _mm256_set1_epi32(k % 2 ? static_cast<int>(0x80402010) : 0x08040201);
    u[k] = _mm256_or_si256(
        u[k], _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), bytes(0x10)));
  }
}
[[gnu::always_inline]] inline void iq4nl_lookup(__m256i* u, int n) {
  const __m256i t = _mm256_broadcastsi128_si256(load16(kIq4nlValues));
  for (int k = 0; k < n; ++k) u[k] = _mm256_shuffle_epi8(t, u[k]);
}

// The 32-element formats' blocks: [d][m: kMin][qh: kQh][levels], kBytes each.
struct Q8_0 {
  static constexpr size_t kBytes = sizeof(BlockQ8_0);
  static constexpr int kShift = 0;
  static constexpr bool kSigned = true, kMin = false, kQh = false, kNibbles = false;
  template <bool kHalf>
  static void levels(const uint8_t* q, __m256i u[8]) {
    for (int k = 0; k < (kHalf ? 4 : 8); ++k) u[k] = load32(q + 32 * k);
  }
};
struct Q4_0 {
  static constexpr size_t kBytes = sizeof(BlockQ4_0);
  static constexpr int kShift = 3;
  static constexpr bool kSigned = false, kMin = false, kQh = false, kNibbles = true;
  template <bool kHalf>
  static void levels(const uint8_t* q, __m256i u[8]) {
    cpu_nibbles<kHalf>(q, u);
  }
};
struct Q4_1 {
  static constexpr size_t kBytes = sizeof(BlockQ4_1);
  static constexpr int kShift = 0;
  static constexpr bool kSigned = false, kMin = true, kQh = false, kNibbles = true;
  template <bool kHalf>
  static void levels(const uint8_t* q, __m256i u[8]) {
    cpu_nibbles<kHalf>(q, u);
  }
};
struct Q5_0 {
  static constexpr size_t kBytes = sizeof(BlockQ5_0);
  static constexpr int kShift = 4;
  static constexpr bool kSigned = false, kMin = false, kQh = true, kNibbles = true;
  template <bool kHalf>
  static void levels(const uint8_t* q, __m256i u[8]) {
    cpu_nibbles<kHalf>(q + 32, u);
    fifth_bits<kHalf>(load32(q), u);
  }
};
struct Q5_1 {
  static constexpr size_t kBytes = sizeof(BlockQ5_1);
  static constexpr int kShift = 0;
  static constexpr bool kSigned = false, kMin = true, kQh = true, kNibbles = true;
  template <bool kHalf>
  static void levels(const uint8_t* q, __m256i u[8]) {
    cpu_nibbles<kHalf>(q + 32, u);
    fifth_bits<kHalf>(load32(q), u);
  }
};
struct IQ4_NL {
  static constexpr size_t kBytes = sizeof(BlockIQ4_NL);
  static constexpr int kShift = 0;
  static constexpr bool kSigned = true, kMin = false, kQh = false, kNibbles = true;
  template <bool kHalf>
  static void levels(const uint8_t* q, __m256i u[8]) {
    cpu_nibbles<kHalf>(q, u);
    iq4nl_lookup(u, kHalf ? 4 : 8);
  }
};

// The super-block formats: a group is one super-block of 256.
inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}

// q4_k, q5_k: sub-block j's weights are d sc_j level - dmin m_j; the levels of sub-blocks 2q
// and 2q + 1 are the low and high nibbles of qs[32 q ..].
[[gnu::always_inline]] inline void k4_scales(const uint8_t* b, Scales& s) {
  const float d = load_f16(b), dmin = load_f16(b + 2);
  // scale_min_k4() four sub-blocks at a time: the 6-bit scales of 0 .. 3 and of 4 .. 7, the
  // mins likewise, a byte each.
  uint32_t q[3];
  std::memcpy(q, b + 4, sizeof q);
  const uint32_t sc_lo = q[0] & 0x3F3F3F3F, m_lo = q[1] & 0x3F3F3F3F;
  const uint32_t sc_hi = (q[2] & 0x0F0F0F0F) | ((q[0] >> 6) & 0x03030303) << 4;
  const uint32_t m_hi = ((q[2] >> 4) & 0x0F0F0F0F) | ((q[1] >> 6) & 0x03030303) << 4;
  const __m128i v = _mm_setr_epi32(static_cast<int>(sc_lo), static_cast<int>(sc_hi),
                                   static_cast<int>(m_lo), static_cast<int>(m_hi));
  // d sc and -(dmin m): the same products as one lane at a time.
  s.d = _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)));
  s.m = _mm256_xor_ps(
      _mm256_mul_ps(_mm256_set1_ps(dmin),
                    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)))),
      _mm256_set1_ps(-0.0f));
}
// The 16 bytes at p, the even ones in bytes 0 .. 7 and the odd ones in 8 .. 15.
[[gnu::always_inline]] inline __m128i even_odd16(const uint8_t* p) {
  return _mm_shuffle_epi8(load16(p),
                          _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
}
[[gnu::always_inline]] inline void k4_levels(const uint8_t* qs, __m256i u[8]) {
  const __m256i shift = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
  for (int h = 0; h < 2; ++h) {  // lanes 2q, 2q + 1 from dword 4h + c of qs[32 q ..]
    const __m256i w0 = load2x16(qs + 16 * h, qs + 64 + 16 * h);
    const __m256i w1 = load2x16(qs + 32 + 16 * h, qs + 96 + 16 * h);
    const __m256i y[4] = {w0, w0, w1, w1};
    __m256i z[4];
    transpose4(y, z);
    for (int c = 0; c < 4; ++c)
      u[4 * h + c] = _mm256_and_si256(_mm256_srlv_epi32(z[c], shift), bytes(0x0F));
  }
}
struct Q4_K {
  static constexpr bool kHalves = false;
  static constexpr int kShift = 0;
  static constexpr bool kSigned = false, kMin = true, k16 = false;
  [[gnu::always_inline]] static void group(const uint8_t* row, int64_t g, int64_t, Scales& s,
                                           __m256i u[8]) {
    const uint8_t* b = row + g * sizeof(BlockQ4_K);
    k4_scales(b, s);
    k4_levels(b + offsetof(BlockQ4_K, qs), u);
  }
};
// q4_k with the fifth bit of element l of sub-block j in bit j of qh[l].
struct Q5_K {
  static constexpr bool kHalves = false;
  static constexpr int kShift = 0;
  static constexpr bool kSigned = false, kMin = true, k16 = false;
  [[gnu::always_inline]] static void group(const uint8_t* row, int64_t g, int64_t, Scales& s,
                                           __m256i u[8]) {
    const uint8_t* b = row + g * sizeof(BlockQ5_K);
    k4_scales(b, s);
    k4_levels(b + offsetof(BlockQ5_K, qs), u);
    const uint8_t* qh = b + offsetof(BlockQ5_K, qh);
    for (int k = 0; k < 8; ++k)
      u[k] = _mm256_or_si256(
          u[k], bit_of_lane(_mm256_set1_epi32(static_cast<int>(load_u32(qh + 4 * k))), 0x10));
  }
};

// Bits 2 (j % 4) of qs[32 (j / 4) + e] for element e of sub-block j (q2_k, q3_k): lane j's
// dword k.
[[gnu::always_inline]] inline __m256i two_bits(const uint8_t* qs, int k) {
  const __m256i shift = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  return _mm256_and_si256(_mm256_srlv_epi32(dword2x4(qs + 4 * k, qs + 32 + 4 * k), shift),
                          bytes(3));
}

// q6_k: sub-block j of 32 is group k = j % 4 of half h = j / 4: the low 4 bits from ql (low
// nibbles of ql[64 h + 32 (k % 2) ..] for k < 2, high ones for k >= 2), bits 2k, 2k + 1 of
// qh[32 h ..]; weights d sc (level - 32) per sub-block of 16.
struct Q6_K {
  static constexpr bool kHalves = false;
  static constexpr int kShift = 5;
  static constexpr bool kSigned = false, kMin = false, k16 = true;
  [[gnu::always_inline]] static void group(const uint8_t* row, int64_t g, int64_t, Scales& s,
                                           __m256i u[8]) {
    const auto* q = reinterpret_cast<const BlockQ6_K*>(row + g * sizeof(BlockQ6_K));
    const __m256 d = _mm256_set1_ps(load_f16(q->d));
    const __m128i sc = even_odd16(reinterpret_cast<const uint8_t*>(q->scales));  // int8
    s.d = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
    s.dh = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))));
    const __m256i nib = _mm256_setr_epi32(0, 0, 4, 4, 0, 0, 4, 4);
    const __m256i qsh = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
    for (int n = 0; n < 2; ++n) {
      const __m256i w0 = load2x16(q->ql + 16 * n, q->ql + 64 + 16 * n);
      const __m256i w1 = load2x16(q->ql + 32 + 16 * n, q->ql + 96 + 16 * n);
      const __m256i y[4] = {w0, w1, w0, w1};
      __m256i z[4];
      transpose4(y, z);
      for (int c = 0; c < 4; ++c) {
        const int k = 4 * n + c;
        const __m256i l4 = _mm256_and_si256(_mm256_srlv_epi32(z[c], nib), bytes(0x0F));
        const __m256i h2 = _mm256_srlv_epi32(dword2x4(q->qh + 4 * k, q->qh + 32 + 4 * k), qsh);
        u[k] = _mm256_or_si256(l4, _mm256_and_si256(_mm256_slli_epi32(h2, 4), bytes(0x30)));
      }
    }
  }
};

// q2_k: element 32k + l of half h is bits 2k of qs[32 h + l]; weights d sc level - dmin m per
// sub-block of 16.
struct Q2_K {
  static constexpr bool kHalves = false;
  static constexpr int kShift = 0;
  static constexpr bool kSigned = false, kMin = true, k16 = true;
  [[gnu::always_inline]] static void group(const uint8_t* row, int64_t g, int64_t, Scales& s,
                                           __m256i u[8]) {
    const auto* q = reinterpret_cast<const BlockQ2_K*>(row + g * sizeof(BlockQ2_K));
    const __m256 d = _mm256_set1_ps(load_f16(q->d)), dmin = _mm256_set1_ps(load_f16(q->dmin));
    const __m128i b = even_odd16(q->scales), nib = _mm_set1_epi8(0x0F);
    const __m128i sc = _mm_and_si128(b, nib), m = _mm_and_si128(_mm_srli_epi16(b, 4), nib);
    // d sc and -(dmin m) per lane, the even sub-blocks of 16 then the odd.
    const auto lanes8 = [](__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); };
    const __m256 neg = _mm256_set1_ps(-0.0f);
    s.d = _mm256_mul_ps(d, lanes8(sc));
    s.dh = _mm256_mul_ps(d, lanes8(_mm_srli_si128(sc, 8)));
    s.m = _mm256_xor_ps(_mm256_mul_ps(dmin, lanes8(m)), neg);
    s.mh = _mm256_xor_ps(_mm256_mul_ps(dmin, lanes8(_mm_srli_si128(m, 8))), neg);
    for (int k = 0; k < 8; ++k) u[k] = two_bits(q->qs, k);
  }
};

// q3_k: q2_k's two bits and a third, bit j of hmask[l] for sub-block j; levels 0..7 stand for
// -4..3 (the offset 4), scaled by d sc per sub-block of 16.
struct Q3_K {
  static constexpr bool kHalves = false;
  static constexpr int kShift = 2;
  static constexpr bool kSigned = false, kMin = false, k16 = true;
  [[gnu::always_inline]] static void group(const uint8_t* row, int64_t g, int64_t, Scales& s,
                                           __m256i u[8]) {
    const auto* q = reinterpret_cast<const BlockQ3_K*>(row + g * sizeof(BlockQ3_K));
    const float d = load_f16(q->d);
    float sc[2][8];
    for (int i = 0; i < 16; ++i)
      sc[i % 2][i / 2] = d * static_cast<float>(scale_q3_k(i, q->scales));
    s.d = load8(sc[0]);
    s.dh = load8(sc[1]);
    for (int k = 0; k < 8; ++k) {
      const __m256i hm = _mm256_set1_epi32(static_cast<int>(load_u32(q->hmask + 4 * k)));
      u[k] = _mm256_or_si256(two_bits(q->qs, k), bit_of_lane(hm, 0x04));
    }
  }
};

// iq4_xs: iq4_nl sub-blocks of 16 bytes each under d times a 6-bit scale each.
struct IQ4_XS {
  static constexpr bool kHalves = false;
  static constexpr int kShift = 0;
  static constexpr bool kSigned = true, kMin = false, k16 = false;
  [[gnu::always_inline]] static void group(const uint8_t* row, int64_t g, int64_t, Scales& s,
                                           __m256i u[8]) {
    const auto* q = reinterpret_cast<const BlockIQ4_XS*>(row + g * sizeof(BlockIQ4_XS));
    const float d = load_f16(q->d);
    float ds[8];
    for (int j = 0; j < 8; ++j) ds[j] = d * static_cast<float>(scale_iq4_xs(j, *q));
    s.d = load8(ds);
    nibble_levels(q->qs, 16, u);
    iq4nl_lookup(u, 8);
  }
};

}  // namespace kvs::cpu::lanes
