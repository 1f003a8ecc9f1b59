// dot_row: fused dequantize + dot for decode matvecs, f32 accumulation. Per block the integer
// levels are dotted with x first and scaled once: sum_i (d q_i + m) x_i = d sum q_i x_i +
// m sum x_i. That reorders the float rounding relative to dequantize-then-dot, nothing else.
#include <immintrin.h>

#include "kvs/quant/blocks.h"
#include "kvs/quant/simd.h"

namespace kvs {
namespace {

using namespace quant;

inline __m256 ld(const float* x) {
  return _mm256_loadu_ps(x);
}
// s + q * x[0..8)
inline __m256 fma_q(__m256i q, const float* x, __m256 s) {
  return _mm256_fmadd_ps(to_ps(q), ld(x), s);
}
inline __m256 sum32(const float* x) {
  return _mm256_add_ps(_mm256_add_ps(ld(x), ld(x + 8)), _mm256_add_ps(ld(x + 16), ld(x + 24)));
}

float dot_f32(const float* w, const float* x, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_fmadd_ps(ld(w + i), ld(x + i), a0);
    a1 = _mm256_fmadd_ps(ld(w + i + 8), ld(x + i + 8), a1);
    a2 = _mm256_fmadd_ps(ld(w + i + 16), ld(x + i + 16), a2);
    a3 = _mm256_fmadd_ps(ld(w + i + 24), ld(x + i + 24), a3);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(ld(w + i), ld(x + i), a0);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; i < n; ++i) s += w[i] * x[i];
  return s;
}

// f16 and bf16: widen 8 at a time.
inline __m256 widen_f16(const uint8_t* p) {
  return _mm256_cvtph_ps(load16(p));
}
inline __m256 widen_bf16(const uint8_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load16(p)), 16));
}
template <bool bf>
float dot_half(const uint8_t* w, const float* x, int64_t n) {
  auto widen = [](const uint8_t* p) { return bf ? widen_bf16(p) : widen_f16(p); };
  __m256 a0 = _mm256_setzero_ps(), a1 = a0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(widen(w + 2 * i), ld(x + i), a0);
    a1 = _mm256_fmadd_ps(widen(w + 2 * i + 16), ld(x + i + 8), a1);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(widen(w + 2 * i), ld(x + i), a0);
  float s = hsum(_mm256_add_ps(a0, a1));
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, w + 2 * i, 2);
    s += (bf ? bf16_to_f32(h) : f16_to_f32(h)) * x[i];
  }
  return s;
}

// sum q x over a 4-bit 32-block (off subtracted from the levels).
inline __m256 dot_q4(const uint8_t* qs, const float* x, __m256i off) {
  __m256i q[4];
  q4_levels(qs, off, q);
  __m256 s = _mm256_mul_ps(to_ps(q[0]), ld(x));
  s = fma_q(q[1], x + 8, s);
  s = fma_q(q[2], x + 16, s);
  return fma_q(q[3], x + 24, s);
}

float dot_q4_0(const BlockQ4_0* b, const float* x, int64_t nb) {
  const __m256i eight = _mm256_set1_epi32(8);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    acc = _mm256_fmadd_ps(bcast_f16(b[i].d), dot_q4(b[i].qs, x, eight), acc);
  }
  return hsum(acc);
}

float dot_q4_1(const BlockQ4_1* b, const float* x, int64_t nb) {
  const __m256i zero = _mm256_setzero_si256();
  __m256 acc = _mm256_setzero_ps(), accm = acc;
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    acc = _mm256_fmadd_ps(bcast_f16(b[i].d), dot_q4(b[i].qs, x, zero), acc);
    accm = _mm256_fmadd_ps(bcast_f16(b[i].m), sum32(x), accm);
  }
  return hsum(_mm256_add_ps(acc, accm));
}

inline __m256 dot_q5(const uint8_t* qs, const uint8_t* qhp, const float* x, __m256i off) {
  __m256i q[4];
  q5_levels(qs, qhp, q);
  __m256 s = _mm256_mul_ps(to_ps(_mm256_sub_epi32(q[0], off)), ld(x));
  s = fma_q(_mm256_sub_epi32(q[1], off), x + 8, s);
  s = fma_q(_mm256_sub_epi32(q[2], off), x + 16, s);
  return fma_q(_mm256_sub_epi32(q[3], off), x + 24, s);
}

float dot_q5_0(const BlockQ5_0* b, const float* x, int64_t nb) {
  const __m256i sixteen = _mm256_set1_epi32(16);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    acc = _mm256_fmadd_ps(bcast_f16(b[i].d), dot_q5(b[i].qs, b[i].qh, x, sixteen), acc);
  }
  return hsum(acc);
}

float dot_q5_1(const BlockQ5_1* b, const float* x, int64_t nb) {
  const __m256i zero = _mm256_setzero_si256();
  __m256 acc = _mm256_setzero_ps(), accm = acc;
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    acc = _mm256_fmadd_ps(bcast_f16(b[i].d), dot_q5(b[i].qs, b[i].qh, x, zero), acc);
    accm = _mm256_fmadd_ps(bcast_f16(b[i].m), sum32(x), accm);
  }
  return hsum(_mm256_add_ps(acc, accm));
}

inline __m256 dot_q8(const int8_t* qs, const float* x) {
  __m256 s = _mm256_mul_ps(to_ps(i8_lanes(qs)), ld(x));
  s = fma_q(i8_lanes(qs + 8), x + 8, s);
  s = fma_q(i8_lanes(qs + 16), x + 16, s);
  return fma_q(i8_lanes(qs + 24), x + 24, s);
}

float dot_q8_0(const BlockQ8_0* b, const float* x, int64_t nb) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
  int64_t i = 0;
  // Two blocks per step: two independent accumulators hide the FMA latency.
  for (; i + 2 <= nb; i += 2, x += 2 * QK) {
    acc0 = _mm256_fmadd_ps(bcast_f16(b[i].d), dot_q8(b[i].qs, x), acc0);
    acc1 = _mm256_fmadd_ps(bcast_f16(b[i + 1].d), dot_q8(b[i + 1].qs, x + QK), acc1);
  }
  if (i < nb) acc0 = _mm256_fmadd_ps(bcast_f16(b[i].d), dot_q8(b[i].qs, x), acc0);
  return hsum(_mm256_add_ps(acc0, acc1));
}

// k-quants: per sub-block, ds * sum q x - dm * sum x.
float dot_q4_k(const BlockQ4_K* b, const float* x, int64_t nb) {
  __m256 acc = _mm256_setzero_ps(), accm = acc;
  for (int64_t i = 0; i < nb; ++i) {
    float ds[8], dm[8];
    k_scales(b[i].d, b[i].dmin, b[i].scales, ds, dm);
    for (int s = 0; s < 8; s += 2, x += 64) {
      __m256 s0 = _mm256_setzero_ps(), s1 = s0;
      for (int g = 0; g < 4; ++g) {
        const __m256i v = u8_lanes(b[i].qs + 16 * s + 8 * g);
        s0 = fma_q(low4(v), x + 8 * g, s0);
        s1 = fma_q(high4(v), x + 32 + 8 * g, s1);
      }
      acc = _mm256_fmadd_ps(_mm256_set1_ps(ds[s]), s0, acc);
      acc = _mm256_fmadd_ps(_mm256_set1_ps(ds[s + 1]), s1, acc);
      accm = _mm256_fmadd_ps(_mm256_set1_ps(dm[s]), sum32(x), accm);
      accm = _mm256_fmadd_ps(_mm256_set1_ps(dm[s + 1]), sum32(x + 32), accm);
    }
  }
  return hsum(_mm256_sub_ps(acc, accm));
}

float dot_q5_k(const BlockQ5_K* b, const float* x, int64_t nb) {
  const __m256i bit4 = _mm256_set1_epi32(0x10);
  __m256 acc = _mm256_setzero_ps(), accm = acc;
  for (int64_t i = 0; i < nb; ++i) {
    float ds[8], dm[8];
    k_scales(b[i].d, b[i].dmin, b[i].scales, ds, dm);
    __m256i qh4[4];  // as in deq_q5_k: (qh4 >> s) & 0x10 is the fifth bit for sub-block s
    for (int g = 0; g < 4; ++g) qh4[g] = _mm256_slli_epi32(u8_lanes(b[i].qh + 8 * g), 4);
    for (int s = 0; s < 8; s += 2, x += 64) {
      const __m128i c0 = _mm_cvtsi32_si128(s), c1 = _mm_cvtsi32_si128(s + 1);
      __m256 s0 = _mm256_setzero_ps(), s1 = s0;
      for (int g = 0; g < 4; ++g) {
        const __m256i v = u8_lanes(b[i].qs + 16 * s + 8 * g);
        const __m256i h0 = _mm256_and_si256(_mm256_srl_epi32(qh4[g], c0), bit4);
        const __m256i h1 = _mm256_and_si256(_mm256_srl_epi32(qh4[g], c1), bit4);
        s0 = fma_q(_mm256_or_si256(low4(v), h0), x + 8 * g, s0);
        s1 = fma_q(_mm256_or_si256(high4(v), h1), x + 32 + 8 * g, s1);
      }
      acc = _mm256_fmadd_ps(_mm256_set1_ps(ds[s]), s0, acc);
      acc = _mm256_fmadd_ps(_mm256_set1_ps(ds[s + 1]), s1, acc);
      accm = _mm256_fmadd_ps(_mm256_set1_ps(dm[s]), sum32(x), accm);
      accm = _mm256_fmadd_ps(_mm256_set1_ps(dm[s + 1]), sum32(x + 32), accm);
    }
  }
  return hsum(_mm256_sub_ps(acc, accm));
}

float dot_q6_k(const BlockQ6_K* b, const float* x, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d);
    for (int h = 0; h < 2; ++h, x += 128) {
      // s[j]: sum q x over sub-block j (16 elements) of this half: element 32k + l is in 2k + l/16.
      __m256 s[8];
      for (int j = 0; j < 8; ++j) s[j] = _mm256_setzero_ps();
      for (int g = 0; g < 4; ++g) {
        __m256i q[4];
        q6_lanes(b[i].ql + 64 * h, b[i].qh + 32 * h, g, q);
        for (int k = 0; k < 4; ++k)
          s[2 * k + g / 2] = fma_q(q[k], x + 32 * k + 8 * g, s[2 * k + g / 2]);
      }
      const int8_t* sc = b[i].scales + 8 * h;
      for (int j = 0; j < 8; ++j) {
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * static_cast<float>(sc[j])), s[j], acc);
      }
    }
  }
  return hsum(acc);
}

// sum q x over 32 levels in element order.
inline __m256 dot_levels(const __m256i q[4], const float* x) {
  __m256 s = _mm256_mul_ps(to_ps(q[0]), ld(x));
  s = fma_q(q[1], x + 8, s);
  s = fma_q(q[2], x + 16, s);
  return fma_q(q[3], x + 24, s);
}

float dot_iq4_nl(const BlockIQ4_NL* b, const float* x, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    __m256i q[4];
    iq4_levels(b[i].qs, q);
    acc = _mm256_fmadd_ps(bcast_f16(b[i].d), dot_levels(q, x), acc);
  }
  return hsum(acc);
}

float dot_iq4_xs(const BlockIQ4_XS* b, const float* x, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d);
    for (int j = 0; j < QK_K / QK; ++j, x += QK) {
      __m256i q[4];
      iq4_levels(b[i].qs + 16 * j, q);
      const __m256 dl = _mm256_set1_ps(d * static_cast<float>(scale_iq4_xs(j, b[i])));
      acc = _mm256_fmadd_ps(dl, dot_levels(q, x), acc);
    }
  }
  return hsum(acc);
}

// q2_k/q3_k: per sub-block of 16 (groups g = 0, 1 and 2, 3 of 32 elements), dl * sum q x, less
// ml * sum x for q2_k.
float dot_q2_k(const BlockQ2_K* b, const float* x, int64_t nb) {
  __m256 acc = _mm256_setzero_ps(), accm = acc;
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d), dmin = load_f16(b[i].dmin);
    for (int h = 0; h < 2; ++h) {
      for (int k = 0; k < 4; ++k, x += 32) {
        for (int u = 0; u < 2; ++u) {
          const uint8_t sc = b[i].scales[8 * h + 2 * k + u];
          const float* xu = x + 16 * u;
          __m256 s = _mm256_mul_ps(to_ps(q2_bits(b[i].qs, h, k, 2 * u)), ld(xu));
          s = fma_q(q2_bits(b[i].qs, h, k, 2 * u + 1), xu + 8, s);
          acc = _mm256_fmadd_ps(_mm256_set1_ps(d * static_cast<float>(sc & 0xF)), s, acc);
          accm = _mm256_fmadd_ps(_mm256_set1_ps(dmin * static_cast<float>(sc >> 4)),
                                 _mm256_add_ps(ld(xu), ld(xu + 8)), accm);
        }
      }
    }
  }
  return hsum(_mm256_sub_ps(acc, accm));
}

float dot_q3_k(const BlockQ3_K* b, const float* x, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d);
    for (int h = 0; h < 2; ++h) {
      for (int k = 0; k < 4; ++k, x += 32) {
        for (int u = 0; u < 2; ++u) {
          const float* xu = x + 16 * u;
          __m256 s = _mm256_mul_ps(to_ps(q3_levels(b[i], h, k, 2 * u)), ld(xu));
          s = fma_q(q3_levels(b[i], h, k, 2 * u + 1), xu + 8, s);
          const int sc = scale_q3_k(8 * h + 2 * k + u, b[i].scales);
          acc = _mm256_fmadd_ps(_mm256_set1_ps(d * static_cast<float>(sc)), s, acc);
        }
      }
    }
  }
  return hsum(acc);
}

}  // namespace

float dot_row(DType t, const void* w, const float* x, int64_t n) {
  const int64_t nb = check_blocks("dot_row", t, n);
  switch (t) {
    case DType::F32:
      return dot_f32(static_cast<const float*>(w), x, n);
    case DType::F16:
      return dot_half<false>(static_cast<const uint8_t*>(w), x, n);
    case DType::BF16:
      return dot_half<true>(static_cast<const uint8_t*>(w), x, n);
    case DType::Q4_0:
      return dot_q4_0(static_cast<const BlockQ4_0*>(w), x, nb);
    case DType::Q4_1:
      return dot_q4_1(static_cast<const BlockQ4_1*>(w), x, nb);
    case DType::Q5_0:
      return dot_q5_0(static_cast<const BlockQ5_0*>(w), x, nb);
    case DType::Q5_1:
      return dot_q5_1(static_cast<const BlockQ5_1*>(w), x, nb);
    case DType::Q8_0:
      return dot_q8_0(static_cast<const BlockQ8_0*>(w), x, nb);
    case DType::Q4_K:
      return dot_q4_k(static_cast<const BlockQ4_K*>(w), x, nb);
    case DType::Q5_K:
      return dot_q5_k(static_cast<const BlockQ5_K*>(w), x, nb);
    case DType::Q6_K:
      return dot_q6_k(static_cast<const BlockQ6_K*>(w), x, nb);
    case DType::Q2_K:
      return dot_q2_k(static_cast<const BlockQ2_K*>(w), x, nb);
    case DType::Q3_K:
      return dot_q3_k(static_cast<const BlockQ3_K*>(w), x, nb);
    case DType::IQ4_NL:
      return dot_iq4_nl(static_cast<const BlockIQ4_NL*>(w), x, nb);
    case DType::IQ4_XS:
      return dot_iq4_xs(static_cast<const BlockIQ4_XS*>(w), x, nb);
    default:
      unsupported("dot_row", t);
  }
}

}  // namespace kvs
