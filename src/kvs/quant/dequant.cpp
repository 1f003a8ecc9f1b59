// dequantize_row: the matmul's hot path (weight tiles to f32). AVX2, 8 elements per vector.
// Results are bit identical to dequantize_row_ref: the same float operations in the same order
// (mul, then add; never fused), the integer levels being exact in float.
#include <immintrin.h>

#include "kvs/quant/blocks.h"
#include "kvs/quant/simd.h"

namespace kvs {
namespace {

using namespace quant;

// y[0..8) = d * q, d * q + m, d * q - m.
inline void put(float* y, __m256i q, __m256 d) {
  _mm256_storeu_ps(y, _mm256_mul_ps(d, to_ps(q)));
}
inline void put_add(float* y, __m256i q, __m256 d, __m256 m) {
  _mm256_storeu_ps(y, _mm256_add_ps(_mm256_mul_ps(d, to_ps(q)), m));
}
inline void put_sub(float* y, __m256i q, __m256 d, __m256 m) {
  _mm256_storeu_ps(y, _mm256_sub_ps(_mm256_mul_ps(d, to_ps(q)), m));
}

void deq_f16(const uint8_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(load16(x + 2 * i)));
  for (; i < n; ++i) y[i] = load_f16(x + 2 * i);
}

void deq_bf16(const uint8_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w = _mm256_cvtepu16_epi32(load16(x + 2 * i));
    _mm256_storeu_ps(y + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
  }
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, x + 2 * i, 2);
    y[i] = bf16_to_f32(h);
  }
}

// One q4_0 block from its scale d and quants qs.
inline void block_q4_0(const uint8_t* d, const uint8_t* qs, float* y) {
  const __m256 dv = bcast_f16(d);
  __m256i q[4];
  q4_levels(qs, _mm256_set1_epi32(8), q);
  for (int c = 0; c < 4; ++c) put(y + 8 * c, q[c], dv);
}
inline void block_q8_0(const uint8_t* d, const int8_t* qs, float* y) {
  const __m256 dv = bcast_f16(d);
  for (int g = 0; g < 4; ++g) put(y + 8 * g, i8_lanes(qs + 8 * g), dv);
}

void deq_q4_0(const BlockQ4_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK) block_q4_0(b[i].d, b[i].qs, y);
}

void deq_q4_1(const BlockQ4_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK) {
    const __m256 d = bcast_f16(b[i].d), m = bcast_f16(b[i].m);
    __m256i q[4];
    q4_levels(b[i].qs, _mm256_setzero_si256(), q);
    for (int c = 0; c < 4; ++c) put_add(y + 8 * c, q[c], d, m);
  }
}

void deq_q5_0(const BlockQ5_0* b, float* y, int64_t nb) {
  const __m256i sixteen = _mm256_set1_epi32(16);
  for (int64_t i = 0; i < nb; ++i, y += QK) {
    const __m256 d = bcast_f16(b[i].d);
    __m256i q[4];
    q5_levels(b[i].qs, b[i].qh, q);
    for (int k = 0; k < 4; ++k) put(y + 8 * k, _mm256_sub_epi32(q[k], sixteen), d);
  }
}

void deq_q5_1(const BlockQ5_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK) {
    const __m256 d = bcast_f16(b[i].d), m = bcast_f16(b[i].m);
    __m256i q[4];
    q5_levels(b[i].qs, b[i].qh, q);
    for (int k = 0; k < 4; ++k) put_add(y + 8 * k, q[k], d, m);
  }
}

void deq_q8_0(const BlockQ8_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK) block_q8_0(b[i].d, b[i].qs, y);
}

// k-quants: 32 bytes of qs per pair of sub-blocks (s: low nibbles, s + 1: high nibbles).
void deq_q4_k(const BlockQ4_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    float ds[8], dm[8];
    k_scales(b[i].d, b[i].dmin, b[i].scales, ds, dm);
    for (int s = 0; s < 8; s += 2, y += 64) {
      const __m256 d0 = _mm256_set1_ps(ds[s]), m0 = _mm256_set1_ps(dm[s]);
      const __m256 d1 = _mm256_set1_ps(ds[s + 1]), m1 = _mm256_set1_ps(dm[s + 1]);
      for (int g = 0; g < 4; ++g) {
        const __m256i v = u8_lanes(b[i].qs + 16 * s + 8 * g);
        put_sub(y + 8 * g, low4(v), d0, m0);
        put_sub(y + 32 + 8 * g, high4(v), d1, m1);
      }
    }
  }
}

void deq_q5_k(const BlockQ5_K* b, float* y, int64_t nb) {
  const __m256i bit4 = _mm256_set1_epi32(0x10);
  for (int64_t i = 0; i < nb; ++i) {
    float ds[8], dm[8];
    k_scales(b[i].d, b[i].dmin, b[i].scales, ds, dm);
    // Bit s of qh[l] is the fifth bit of element l of sub-block s; pre-shifted so that
    // (qh4 >> s) & 0x10 extracts it.
    __m256i qh4[4];
    for (int g = 0; g < 4; ++g) qh4[g] = _mm256_slli_epi32(u8_lanes(b[i].qh + 8 * g), 4);
    for (int s = 0; s < 8; s += 2, y += 64) {
      const __m256 d0 = _mm256_set1_ps(ds[s]), m0 = _mm256_set1_ps(dm[s]);
      const __m256 d1 = _mm256_set1_ps(ds[s + 1]), m1 = _mm256_set1_ps(dm[s + 1]);
      const __m128i c0 = _mm_cvtsi32_si128(s), c1 = _mm_cvtsi32_si128(s + 1);
      for (int g = 0; g < 4; ++g) {
        const __m256i v = u8_lanes(b[i].qs + 16 * s + 8 * g);
        const __m256i h0 = _mm256_and_si256(_mm256_srl_epi32(qh4[g], c0), bit4);
        const __m256i h1 = _mm256_and_si256(_mm256_srl_epi32(qh4[g], c1), bit4);
        put_sub(y + 8 * g, _mm256_or_si256(low4(v), h0), d0, m0);
        put_sub(y + 32 + 8 * g, _mm256_or_si256(high4(v), h1), d1, m1);
      }
    }
  }
}

void deq_q6_k(const BlockQ6_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d);
    for (int h = 0; h < 2; ++h, y += 128) {
      const int8_t* sc = b[i].scales + 8 * h;
      __m256 dk[8];  // sub-blocks of 16: element 32k + l has scale sc[2k + l / 16]
      for (int j = 0; j < 8; ++j) dk[j] = _mm256_set1_ps(d * static_cast<float>(sc[j]));
      for (int g = 0; g < 4; ++g) {
        __m256i q[4];
        q6_lanes(b[i].ql + 64 * h, b[i].qh + 32 * h, g, q);
        for (int k = 0; k < 4; ++k) put(y + 32 * k + 8 * g, q[k], dk[2 * k + g / 2]);
      }
    }
  }
}

// q2_k and q3_k: element 128h + 32k + l; elements l < 16 in sub-block 8h + 2k, the others in
// the next one.
void deq_q2_k(const BlockQ2_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d), dmin = load_f16(b[i].dmin);
    for (int h = 0; h < 2; ++h) {
      for (int k = 0; k < 4; ++k, y += 32) {
        __m256 dl[2], ml[2];
        for (int u = 0; u < 2; ++u) {
          const uint8_t sc = b[i].scales[8 * h + 2 * k + u];
          dl[u] = _mm256_set1_ps(d * static_cast<float>(sc & 0xF));
          ml[u] = _mm256_set1_ps(dmin * static_cast<float>(sc >> 4));
        }
        for (int g = 0; g < 4; ++g)
          put_sub(y + 8 * g, q2_bits(b[i].qs, h, k, g), dl[g / 2], ml[g / 2]);
      }
    }
  }
}

void deq_q3_k(const BlockQ3_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d);
    for (int h = 0; h < 2; ++h) {
      for (int k = 0; k < 4; ++k, y += 32) {
        const int s = 8 * h + 2 * k;
        const __m256 dl[2] = {
            _mm256_set1_ps(d * static_cast<float>(scale_q3_k(s, b[i].scales))),
            _mm256_set1_ps(d * static_cast<float>(scale_q3_k(s + 1, b[i].scales)))};
        for (int g = 0; g < 4; ++g) put(y + 8 * g, q3_levels(b[i], h, k, g), dl[g / 2]);
      }
    }
  }
}

void deq_iq4_nl(const BlockIQ4_NL* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK) {
    const __m256 d = bcast_f16(b[i].d);
    __m256i q[4];
    iq4_levels(b[i].qs, q);
    for (int c = 0; c < 4; ++c) put(y + 8 * c, q[c], d);
  }
}

void deq_iq4_xs(const BlockIQ4_XS* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d);
    for (int j = 0; j < QK_K / QK; ++j, y += QK) {
      const __m256 dl = _mm256_set1_ps(d * static_cast<float>(scale_iq4_xs(j, b[i])));
      __m256i q[4];
      iq4_levels(b[i].qs + 16 * j, q);
      for (int c = 0; c < 4; ++c) put(y + 8 * c, q[c], dl);
    }
  }
}

}  // namespace

void dequantize_split(DType t, const uint8_t* scales, const uint8_t* quants, float* y, int64_t nb) {
  switch (t) {
    case DType::Q4_0:
      for (int64_t i = 0; i < nb; ++i) block_q4_0(scales + 2 * i, quants + 16 * i, y + QK * i);
      return;
    case DType::Q8_0:
      for (int64_t i = 0; i < nb; ++i)
        block_q8_0(scales + 2 * i, reinterpret_cast<const int8_t*>(quants) + 32 * i, y + QK * i);
      return;
    default:
      unsupported("dequantize_split", t);
  }
}

void dequantize_row(DType t, const void* x, float* y, int64_t n) {
  const int64_t nb = check_blocks("dequantize_row", t, n);
  switch (t) {
    case DType::F32:
      std::memcpy(y, x, static_cast<size_t>(n) * 4);
      return;
    case DType::F16:
      return deq_f16(static_cast<const uint8_t*>(x), y, n);
    case DType::BF16:
      return deq_bf16(static_cast<const uint8_t*>(x), y, n);
    case DType::Q4_0:
      return deq_q4_0(static_cast<const BlockQ4_0*>(x), y, nb);
    case DType::Q4_1:
      return deq_q4_1(static_cast<const BlockQ4_1*>(x), y, nb);
    case DType::Q5_0:
      return deq_q5_0(static_cast<const BlockQ5_0*>(x), y, nb);
    case DType::Q5_1:
      return deq_q5_1(static_cast<const BlockQ5_1*>(x), y, nb);
    case DType::Q8_0:
      return deq_q8_0(static_cast<const BlockQ8_0*>(x), y, nb);
    case DType::Q4_K:
      return deq_q4_k(static_cast<const BlockQ4_K*>(x), y, nb);
    case DType::Q5_K:
      return deq_q5_k(static_cast<const BlockQ5_K*>(x), y, nb);
    case DType::Q6_K:
      return deq_q6_k(static_cast<const BlockQ6_K*>(x), y, nb);
    case DType::Q2_K:
      return deq_q2_k(static_cast<const BlockQ2_K*>(x), y, nb);
    case DType::Q3_K:
      return deq_q3_k(static_cast<const BlockQ3_K*>(x), y, nb);
    case DType::IQ4_NL:
      return deq_iq4_nl(static_cast<const BlockIQ4_NL*>(x), y, nb);
    case DType::IQ4_XS:
      return deq_iq4_xs(static_cast<const BlockIQ4_XS*>(x), y, nb);
    default:
      unsupported("dequantize_row", t);
  }
}

}  // namespace kvs
