// What quant_dot.cpp's kernels are made of: the activations quantized to two int8 planes, the
// instruction sets' lanes (AVX2, AVX-VNNI, AVX-512 VNNI) and each weight format's blocks read as
// lanes of levels with their scales. Included by quant_dot.cpp alone.
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

// 4 vectors of 8 int32 (each within int8) -> 32 bytes in element order.
inline void pack_bytes(const __m256i q[4], int8_t* out) {
  // packs works within 128-bit lanes: the dwords come out as 0 4 1 5 2 6 3 7.
  const __m256i p =
      _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                      _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

// Block b (0 or 1) of a pair from the 32 floats at x: quantize_x_block of the CUDA backend
// (common.cuh), with the same correctly rounded division, reciprocal, products and rint.
inline void quantize_block(const float* x, XPair& p, int b) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4], amax = _mm256_setzero_ps();
  for (int c = 0; c < 4; ++c) {
    v[c] = _mm256_loadu_ps(x + 8 * c);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[c]));
  }
  const float dx = hmax(amax) / 127.0f;
  const __m256 id = _mm256_set1_ps(dx != 0.0f ? 1.0f / dx : 0.0f);
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  __m256i h[4], l[4];
  for (int c = 0; c < 4; ++c) {
    const __m256 s = _mm256_mul_ps(v[c], id), hf = _mm256_round_ps(s, kRound);
    const __m256 lf = _mm256_round_ps(_mm256_mul_ps(_mm256_sub_ps(s, hf), _mm256_set1_ps(254.0f)),
                                      kRound);
    h[c] = _mm256_cvtps_epi32(hf);
    l[c] = _mm256_cvtps_epi32(lf);
  }
  pack_bytes(h, p.h + 32 * b);
  pack_bytes(l, p.l + 32 * b);
  // Each half of 16 (the mins of q2_k apply per half): a quarter of its sum in each lane.
  for (int half = 0; half < 2; ++half) {
    const int sh = hsum_i32(_mm256_add_epi32(h[2 * half], h[2 * half + 1]));
    const int sl = hsum_i32(_mm256_add_epi32(l[2 * half], l[2 * half + 1]));
    const float sum = static_cast<float>(254 * sh + sl) / 254.0f;  // exact numerator
    _mm_storeu_ps(p.s4 + 8 * b + 4 * half, _mm_set1_ps(dx * sum * 0.25f));
  }
  _mm256_storeu_ps(p.d + 8 * b, _mm256_set1_ps(dx / 254.0f));
  // 254 h + l in v16_index's order: packs leaves dword pairs (0,1) (2,3) (8,9) (10,11) |
  // (4,5) (6,7) (12,13) (14,15) of each 16, the permute sorts them into A's then B's.
  const __m256i k254 = _mm256_set1_epi32(254), ab = _mm256_setr_epi32(0, 4, 2, 6, 1, 5, 3, 7);
  __m256i hl[4];
  for (int c = 0; c < 4; ++c) hl[c] = _mm256_add_epi32(_mm256_madd_epi16(h[c], k254), l[c]);
  const __m256i lo = _mm256_permutevar8x32_epi32(_mm256_packs_epi32(hl[0], hl[1]), ab);
  const __m256i hi = _mm256_permutevar8x32_epi32(_mm256_packs_epi32(hl[2], hl[3]), ab);
  auto* out = reinterpret_cast<__m256i*>(p.v + 32 * b);
  _mm256_store_si256(out, _mm256_permute2x128_si256(lo, hi, 0x20));
  _mm256_store_si256(out + 1, _mm256_permute2x128_si256(lo, hi, 0x31));
}

// ---- helpers ----

inline __m256i load32(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
inline __m256i bytes(int v) {
  return _mm256_set1_epi8(static_cast<char>(v));
}
// 16 bytes of nibbles -> 32 levels: element j in the low nibble of byte j, j + 16 in the high
// (the bytes in both halves, the upper half shifted).
inline __m256i nibbles(const uint8_t* qs) {
  const __m256i v = _mm256_broadcastsi128_si256(load16(qs));
  return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)), bytes(0x0F));
}
// 0x10 in byte i where bit i of the 32 bits at p is set (q5_0, q5_1).
inline __m256i fifth_bits(const uint8_t* p) {
  const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                          2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(load_u32(p))), spread);
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), bytes(0x10));
}
// Bits from .. from + 1 of each byte (16-bit shifts, masked per byte) moved to the bits of mask.
inline __m256i move_bits(__m256i v, int from, int to, int mask) {
  const __m256i s = from <= to ? _mm256_slli_epi16(v, to - from) : _mm256_srli_epi16(v, from - to);
  return _mm256_and_si256(s, bytes(mask));
}

// ---- instruction sets: 16 int32 / float lanes (lane i: elements 4i .. 4i + 3 of a pair) ----
// Each builds a pair's levels and scales from a format's bytes and holds the float steps;
// Avx512 also takes the dot products (tile()), the 256-bit sets take theirs in tile16().

// Two 256-bit halves: AVX2 and AVX-VNNI.
struct Avx2 {
  struct VI {
    __m256i a, b;
  };
  struct VF {
    __m256 a, b;
  };
  static VF zerof() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static VI join(__m256i a, __m256i b) { return {a, b}; }
  static VF loadf(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  // The nibbles of 16 bytes at a, then of 16 at b, as levels (nibbles()).
  static VI nibbles2(const uint8_t* a, const uint8_t* b) { return {nibbles(a), nibbles(b)}; }
  // 32 bytes at p: their low nibbles, then their high nibbles.
  static VI nibbles32(const uint8_t* p) {
    const __m256i v = load32(p);
    return {_mm256_and_si256(v, bytes(0x0F)), _mm256_and_si256(_mm256_srli_epi16(v, 4), bytes(0x0F))};
  }
  static VI bytes2(const uint8_t* a, const uint8_t* b) { return {load32(a), load32(b)}; }
  static VI lookup(VI idx, __m128i table) {
    const __m256i t = _mm256_broadcastsi128_si256(table);
    return {_mm256_shuffle_epi8(t, idx.a), _mm256_shuffle_epi8(t, idx.b)};
  }
  static VI bits_or(VI a, VI b) { return {_mm256_or_si256(a.a, b.a), _mm256_or_si256(a.b, b.b)}; }
  // p[0] in lanes 0 .. 7, p[1] in 8 .. 15: broadcasts from memory, which take no shuffle port.
  static VF rep8p(const float* p) { return {_mm256_broadcast_ss(p), _mm256_broadcast_ss(p + 1)}; }
  // v[i] in lanes 8 (i - first) .. + 7 for i = first, first + 1 (through memory, as rep8p).
  static VF rep8(__m128 v, int first) {
    alignas(16) float f[4];
    _mm_store_ps(f, v);
    return rep8p(f + first);
  }
  // v[i] in lanes 4 i .. 4 i + 3.
  static VF rep4(__m128 v) {
    const __m256 w = _mm256_castps128_ps256(v);
    return {_mm256_permutevar8x32_ps(w, _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1)),
            _mm256_permutevar8x32_ps(w, _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3))};
  }
  static VF mul(VF a, VF b) { return {_mm256_mul_ps(a.a, b.a), _mm256_mul_ps(a.b, b.b)}; }
  static VF fma(VF a, VF b, VF c) {
    return {_mm256_fmadd_ps(a.a, b.a, c.a), _mm256_fmadd_ps(a.b, b.b, c.b)};
  }
  static VF cvt(VI v) { return {_mm256_cvtepi32_ps(v.a), _mm256_cvtepi32_ps(v.b)}; }
  static float sum(VF v) { return hsum(_mm256_add_ps(v.a, v.b)); }
};

#define KVS_AVX512 gnu::target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")

// Clang refuses 512-bit values through the templates' calls, which GCC's flatten inlines into
// the AVX-512 function: a clang build takes the 256-bit kernels there (the same bits).
#ifndef __clang__
#define KVS_HAVE_AVX512_KERNELS 1
// The 256-bit kernels' products in AVX-512 VNNI's VL form (tile16()).
struct Dpwssd16Vl {
  static constexpr bool kInt16 = true;
  [[KVS_AVX512]] static __m256i dot(__m256i acc, __m256i a, __m256i v) {
    return _mm256_dpwssd_epi32(acc, a, v);
  }
};
// One 512-bit register.
struct Avx512 {
  static constexpr bool kInt16 = false;  // bytes against the two planes (tile())
  using Narrow = Dpwssd16Vl;             // the tokens short of a tile of kToks
  static constexpr int kRows = 2, kToks = 8, kRows1 = 4;  // 32 registers
  using VI = __m512i;
  using VF = __m512;
  [[KVS_AVX512]] static VI zero() { return _mm512_setzero_si512(); }
  [[KVS_AVX512]] static VF zerof() { return _mm512_setzero_ps(); }
  [[KVS_AVX512]] static VI join(__m256i a, __m256i b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
  }
  [[KVS_AVX512]] static VI load(const int8_t* p) { return _mm512_loadu_si512(p); }
  [[KVS_AVX512]] static VF loadf(const float* p) { return _mm512_loadu_ps(p); }
  [[KVS_AVX512]] static VI nibbles2(const uint8_t* a, const uint8_t* b) {
    const __m512i v = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(load16(a)), 0xFF00, load16(b));
    return _mm512_and_si512(_mm512_srlv_epi64(v, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)),
                            _mm512_set1_epi8(0x0F));
  }
  [[KVS_AVX512]] static VI nibbles32(const uint8_t* p) {
    const __m512i v = _mm512_broadcast_i64x4(load32(p));
    return _mm512_and_si512(_mm512_srlv_epi64(v, _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4)),
                            _mm512_set1_epi8(0x0F));
  }
  [[KVS_AVX512]] static VI bytes2(const uint8_t* a, const uint8_t* b) { return join(load32(a), load32(b)); }
  [[KVS_AVX512]] static VI lookup(VI idx, __m128i table) {
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(table), idx);
  }
  [[KVS_AVX512]] static VI bits_or(VI a, VI b) { return _mm512_or_si512(a, b); }
  [[KVS_AVX512]] static VF rep8p(const float* p) {
    return rep8(_mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))), 0);
  }
  [[KVS_AVX512]] static VF rep8(__m128 v, int first) {
    const __m512i i = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    return _mm512_permutexvar_ps(_mm512_add_epi32(i, _mm512_set1_epi32(first)),
                                 _mm512_castps128_ps512(v));
  }
  [[KVS_AVX512]] static VF rep4(__m128 v) {
    const __m512i i = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    return _mm512_permutexvar_ps(i, _mm512_castps128_ps512(v));
  }
  [[KVS_AVX512]] static VI dot(VI acc, VI u, VI x) { return _mm512_dpbusd_epi32(acc, u, x); }
  [[KVS_AVX512]] static VI xor80(VI u) {
    return _mm512_xor_si512(u, _mm512_set1_epi8(static_cast<char>(0x80)));
  }
  [[KVS_AVX512]] static VI offset(VI x, int s) {
    return _mm512_sub_epi32(zero(), _mm512_dpbusd_epi32(zero(), _mm512_set1_epi8(static_cast<char>(1 << s)), x));
  }
  template <bool kNarrow>
  [[KVS_AVX512]] static VI combine(VI h, VI l) {
    if constexpr (kNarrow)
      return _mm512_dpwssd_epi32(l, h, _mm512_set1_epi32(254));
    else
      return _mm512_add_epi32(_mm512_mullo_epi32(h, _mm512_set1_epi32(254)), l);
  }
  [[KVS_AVX512]] static VF mul(VF a, VF b) { return _mm512_mul_ps(a, b); }
  [[KVS_AVX512]] static VF fma(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
  [[KVS_AVX512]] static VF cvt(VI v) { return _mm512_cvtepi32_ps(v); }
  [[KVS_AVX512]] static float sum(VF v) {
    return hsum(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
  }
};
#endif

// ---- weight formats ----
// A unit is kSubs sub-blocks of 32 read from kUnitBytes of a row: two blocks of the 32-element
// formats (a pair), or one super-block of 256. scales() reads a unit's scales once; `two` is
// false for a pair whose second block is past the row's end, which then re-reads the first (its
// activations are zeros, so it adds exactly nothing). For pair q of the unit (its sub-blocks
// 2q, 2q + 1) a format gives the levels as 64 bytes in element order, unsigned (the weight is
// d (level - 2^kShift), or with kMin d level + min) or signed (kSigned: d level); the scales d
// per lane, and with kMin the mins per lane.

// The 32-element formats: Pair<B> is the unit of two of B's blocks; every block starts with its
// f16 scale d, and those with a min have it next.
template <class B>
struct Pair : B {
  static constexpr size_t kUnitBytes = 2 * B::kBytes;
  static constexpr int kSubs = 2;
  struct Scales {
    const uint8_t* b[2];
    __m128 dm;  // d0, d1, m0, m1
  };
  static void scales(const uint8_t* u, bool two, Scales& s) {
    s.b[0] = u;
    s.b[1] = two ? u + B::kBytes : u;
    const int h0 = static_cast<int>(load_u32(s.b[0])), h1 = static_cast<int>(load_u32(s.b[1]));
    s.dm = _mm_cvtph_ps(_mm_unpacklo_epi16(_mm_cvtsi32_si128(h0), _mm_cvtsi32_si128(h1)));
  }
  template <class I>
  [[gnu::always_inline]] static typename I::VI levels(const Scales& s, int) {
    return B::template levels<I>(s.b[0], s.b[1]);
  }
  template <class I>
  [[gnu::always_inline]] static typename I::VF scale(const Scales& s, int) {
    return I::rep8(s.dm, 0);
  }
  template <class I>
  [[gnu::always_inline]] static typename I::VF min(const Scales& s, int) {
    return I::rep8(s.dm, 2);
  }
};

struct Q8_0 {
  static constexpr size_t kBytes = sizeof(BlockQ8_0);
  static constexpr int kShift = 0;
  static constexpr bool kSigned = true, kMin = false;
  template <class I>
  [[gnu::always_inline]] static typename I::VI levels(const uint8_t* a, const uint8_t* b) {
    return I::bytes2(a + 2, b + 2);
  }
};
struct Q4_0 {
  static constexpr size_t kBytes = sizeof(BlockQ4_0);
  static constexpr int kShift = 3;
  static constexpr bool kSigned = false, kMin = false;
  template <class I>
  [[gnu::always_inline]] static typename I::VI levels(const uint8_t* a, const uint8_t* b) {
    return I::nibbles2(a + 2, b + 2);
  }
};
struct Q4_1 {
  static constexpr size_t kBytes = sizeof(BlockQ4_1);
  static constexpr int kShift = 0;
  static constexpr bool kSigned = false, kMin = true;
  template <class I>
  [[gnu::always_inline]] static typename I::VI levels(const uint8_t* a, const uint8_t* b) {
    return I::nibbles2(a + 4, b + 4);
  }
};
struct Q5_0 {
  static constexpr size_t kBytes = sizeof(BlockQ5_0);
  static constexpr int kShift = 4;
  static constexpr bool kSigned = false, kMin = false;
  template <class I>
  [[gnu::always_inline]] static typename I::VI levels(const uint8_t* a, const uint8_t* b) {
    return I::bits_or(I::nibbles2(a + 6, b + 6), I::join(fifth_bits(a + 2), fifth_bits(b + 2)));
  }
};
struct Q5_1 {
  static constexpr size_t kBytes = sizeof(BlockQ5_1);
  static constexpr int kShift = 0;
  static constexpr bool kSigned = false, kMin = true;
  template <class I>
  [[gnu::always_inline]] static typename I::VI levels(const uint8_t* a, const uint8_t* b) {
    return I::bits_or(I::nibbles2(a + 8, b + 8), I::join(fifth_bits(a + 4), fifth_bits(b + 4)));
  }
};
struct IQ4_NL {
  static constexpr size_t kBytes = sizeof(BlockIQ4_NL);
  static constexpr int kShift = 0;
  static constexpr bool kSigned = true, kMin = false;
  template <class I>
  [[gnu::always_inline]] static typename I::VI levels(const uint8_t* a, const uint8_t* b) {
    return I::lookup(I::nibbles2(a + 2, b + 2), load16(kIq4nlValues));
  }
};

// The super-block formats: 8 sub-blocks of 32 (scales per 32 in d[8], or per 16 in d[16]).
template <class Block>
struct Super {
  static constexpr size_t kUnitBytes = sizeof(Block);
  static constexpr int kSubs = 8;
};
struct Scales8 {
  const uint8_t* b;
  float d[8], m[8];
};
struct Scales16 {
  const uint8_t* b;
  float d[16], m[16];
};
inline __m128 load4(const float* p) {
  return _mm_loadu_ps(p);
}

// q4_k, q5_k: sub-block j's weights are d sc_j level - dmin m_j; the levels of sub-blocks 2q
// and 2q + 1 are the low and high nibbles of qs[32 q ..].
inline void k4_scales(const uint8_t* b, Scales8& s) {
  s.b = b;
  const float d = load_f16(b), dmin = load_f16(b + 2);
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    scale_min_k4(j, b + 4, sc, m);
    s.d[j] = d * static_cast<float>(sc);
    s.m[j] = -(dmin * static_cast<float>(m));
  }
}
struct Q4_K : Super<BlockQ4_K> {
  static constexpr int kShift = 0;
  static constexpr bool kSigned = false, kMin = true;
  using Scales = Scales8;
  static void scales(const uint8_t* b, bool, Scales& s) { k4_scales(b, s); }
  template <class I>
  [[gnu::always_inline]] static typename I::VI levels(const Scales& s, int q) {
    return I::nibbles32(s.b + offsetof(BlockQ4_K, qs) + 32 * q);
  }
  template <class I>
  [[gnu::always_inline]] static typename I::VF scale(const Scales& s, int q) {
    return I::rep8p(s.d + 2 * q);
  }
  template <class I>
  [[gnu::always_inline]] static typename I::VF min(const Scales& s, int q) {
    return I::rep8p(s.m + 2 * q);
  }
};
// q4_k with the fifth bit of element l of sub-block j in bit j of qh[l].
struct Q5_K : Super<BlockQ5_K> {
  static constexpr int kShift = 0;
  static constexpr bool kSigned = false, kMin = true;
  using Scales = Scales8;
  static void scales(const uint8_t* b, bool, Scales& s) { k4_scales(b, s); }
  template <class I>
  [[gnu::always_inline]] static typename I::VI levels(const Scales& s, int q) {
    const __m256i h = load32(s.b + offsetof(BlockQ5_K, qh));
    return I::bits_or(I::nibbles32(s.b + offsetof(BlockQ5_K, qs) + 32 * q),
                      I::join(move_bits(h, 2 * q, 4, 0x10), move_bits(h, 2 * q + 1, 4, 0x10)));
  }
  template <class I>
  [[gnu::always_inline]] static typename I::VF scale(const Scales& s, int q) {
    return I::rep8p(s.d + 2 * q);
  }
  template <class I>
  [[gnu::always_inline]] static typename I::VF min(const Scales& s, int q) {
    return I::rep8p(s.m + 2 * q);
  }
};

// q6_k: sub-block j of 32 is group k = j % 4 of half h = j / 4: the low 4 bits from ql (low
// nibbles of ql[64 h + 32 (k % 2) ..] for k < 2, high ones for k >= 2), bits 2k, 2k + 1 of
// qh[32 h ..]; weights d sc (level - 32) per sub-block of 16.
struct Q6_K : Super<BlockQ6_K> {
  static constexpr int kShift = 5;
  static constexpr bool kSigned = false, kMin = false;
  using Scales = Scales16;
  static void scales(const uint8_t* b, bool, Scales& s) {
    const auto* q = reinterpret_cast<const BlockQ6_K*>(b);
    s.b = b;
    const float d = load_f16(q->d);
    for (int i = 0; i < 16; ++i) s.d[i] = d * static_cast<float>(q->scales[i]);
  }
  template <class I>
  [[gnu::always_inline]] static typename I::VI levels(const Scales& s, int q) {
    const auto* b = reinterpret_cast<const BlockQ6_K*>(s.b);
    const int h = q / 2, k = 2 * (q % 2);  // sub-blocks k, k + 1 of half h
    const __m256i l0 = load32(b->ql + 64 * h), l1 = load32(b->ql + 64 * h + 32);
    const __m256i lo0 = _mm256_and_si256(k ? _mm256_srli_epi16(l0, 4) : l0, bytes(0x0F));
    const __m256i lo1 = _mm256_and_si256(k ? _mm256_srli_epi16(l1, 4) : l1, bytes(0x0F));
    const __m256i qh = load32(b->qh + 32 * h);
    return I::join(_mm256_or_si256(lo0, move_bits(qh, 2 * k, 4, 0x30)),
                   _mm256_or_si256(lo1, move_bits(qh, 2 * k + 2, 4, 0x30)));
  }
  template <class I>
  [[gnu::always_inline]] static typename I::VF scale(const Scales& s, int q) {
    return I::rep4(load4(s.d + 4 * q));
  }
  template <class I>
  [[gnu::always_inline]] static typename I::VF min(const Scales&, int) {
    return I::zerof();
  }
};

// q2_k: element 32k + l of half h is bits 2k of qs[32 h + l], so sub-block j of 32 is those
// bits of qs[32 (j / 4) ..] with k = j % 4; weights d sc level - dmin m per sub-block of 16.
inline __m256i q2_levels(const uint8_t* qs, int j) {
  return _mm256_and_si256(_mm256_srli_epi16(load32(qs + 32 * (j / 4)), 2 * (j % 4)), bytes(3));
}
struct Q2_K : Super<BlockQ2_K> {
  static constexpr int kShift = 0;
  static constexpr bool kSigned = false, kMin = true;
  using Scales = Scales16;
  static void scales(const uint8_t* b, bool, Scales& s) {
    const auto* q = reinterpret_cast<const BlockQ2_K*>(b);
    s.b = b;
    const float d = load_f16(q->d), dmin = load_f16(q->dmin);
    for (int i = 0; i < 16; ++i) {
      s.d[i] = d * static_cast<float>(q->scales[i] & 0xF);
      s.m[i] = -(dmin * static_cast<float>(q->scales[i] >> 4));
    }
  }
  template <class I>
  [[gnu::always_inline]] static typename I::VI levels(const Scales& s, int q) {
    const uint8_t* qs = s.b + offsetof(BlockQ2_K, qs);
    return I::join(q2_levels(qs, 2 * q), q2_levels(qs, 2 * q + 1));
  }
  template <class I>
  [[gnu::always_inline]] static typename I::VF scale(const Scales& s, int q) {
    return I::rep4(load4(s.d + 4 * q));
  }
  template <class I>
  [[gnu::always_inline]] static typename I::VF min(const Scales& s, int q) {
    return I::rep4(load4(s.m + 4 * q));
  }
};

// q3_k: q2_k's two bits and a third, bit j of hmask[l] for sub-block j; levels 0..7 stand for
// -4..3 (the offset 4), scaled by d sc per sub-block of 16.
struct Q3_K : Super<BlockQ3_K> {
  static constexpr int kShift = 2;
  static constexpr bool kSigned = false, kMin = false;
  using Scales = Scales16;
  static void scales(const uint8_t* b, bool, Scales& s) {
    const auto* q = reinterpret_cast<const BlockQ3_K*>(b);
    s.b = b;
    const float d = load_f16(q->d);
    for (int i = 0; i < 16; ++i) s.d[i] = d * static_cast<float>(scale_q3_k(i, q->scales));
  }
  template <class I>
  [[gnu::always_inline]] static typename I::VI levels(const Scales& s, int q) {
    const uint8_t* qs = s.b + offsetof(BlockQ3_K, qs);
    const __m256i hm = load32(s.b + offsetof(BlockQ3_K, hmask));
    return I::join(_mm256_or_si256(q2_levels(qs, 2 * q), move_bits(hm, 2 * q, 2, 0x04)),
                   _mm256_or_si256(q2_levels(qs, 2 * q + 1), move_bits(hm, 2 * q + 1, 2, 0x04)));
  }
  template <class I>
  [[gnu::always_inline]] static typename I::VF scale(const Scales& s, int q) {
    return I::rep4(load4(s.d + 4 * q));
  }
  template <class I>
  [[gnu::always_inline]] static typename I::VF min(const Scales&, int) {
    return I::zerof();
  }
};

// iq4_xs: iq4_nl sub-blocks of 16 bytes each under d times a 6-bit scale each.
struct IQ4_XS : Super<BlockIQ4_XS> {
  static constexpr int kShift = 0;
  static constexpr bool kSigned = true, kMin = false;
  using Scales = Scales8;
  static void scales(const uint8_t* b, bool, Scales& s) {
    const auto* q = reinterpret_cast<const BlockIQ4_XS*>(b);
    s.b = b;
    const float d = load_f16(q->d);
    for (int j = 0; j < 8; ++j) s.d[j] = d * static_cast<float>(scale_iq4_xs(j, *q));
  }
  template <class I>
  [[gnu::always_inline]] static typename I::VI levels(const Scales& s, int q) {
    const uint8_t* qs = s.b + offsetof(BlockIQ4_XS, qs) + 32 * q;
    return I::lookup(I::nibbles2(qs, qs + 16), load16(kIq4nlValues));
  }
  template <class I>
  [[gnu::always_inline]] static typename I::VF scale(const Scales& s, int q) {
    return I::rep8p(s.d + 2 * q);
  }
  template <class I>
  [[gnu::always_inline]] static typename I::VF min(const Scales&, int) {
    return I::zerof();
  }
};

}  // namespace kvs::cpu::lanes
