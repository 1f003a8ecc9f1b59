// dequantize_row: the matmul's hot path (weight tiles to f32). AVX2: each block is unpacked into
// 32 int8 lanes, widened to floats and scaled. Results are bit identical to dequantize_row_ref:
// the same float operations in the same order (mul, then add; never fused).
#include <immintrin.h>

#include "kvs/quant/blocks.h"
#include "kvs/quant/simd.h"

namespace kvs {
namespace {

using namespace quant;

// y[0..32) = d * v.
inline void store_scaled(float* y, __m256i v, __m256 d) {
  _mm256_storeu_ps(y + 0, _mm256_mul_ps(d, lanes_ps<0>(v)));
  _mm256_storeu_ps(y + 8, _mm256_mul_ps(d, lanes_ps<1>(v)));
  _mm256_storeu_ps(y + 16, _mm256_mul_ps(d, lanes_ps<2>(v)));
  _mm256_storeu_ps(y + 24, _mm256_mul_ps(d, lanes_ps<3>(v)));
}
// y[0..16) = d0 * v, y[16..32) = d1 * v (q6_k's sub-blocks of 16).
inline void store_scaled2(float* y, __m256i v, __m256 d0, __m256 d1) {
  _mm256_storeu_ps(y + 0, _mm256_mul_ps(d0, lanes_ps<0>(v)));
  _mm256_storeu_ps(y + 8, _mm256_mul_ps(d0, lanes_ps<1>(v)));
  _mm256_storeu_ps(y + 16, _mm256_mul_ps(d1, lanes_ps<2>(v)));
  _mm256_storeu_ps(y + 24, _mm256_mul_ps(d1, lanes_ps<3>(v)));
}
// y[0..32) = d * v + m.
inline void store_affine(float* y, __m256i v, __m256 d, __m256 m) {
  _mm256_storeu_ps(y + 0, _mm256_add_ps(_mm256_mul_ps(d, lanes_ps<0>(v)), m));
  _mm256_storeu_ps(y + 8, _mm256_add_ps(_mm256_mul_ps(d, lanes_ps<1>(v)), m));
  _mm256_storeu_ps(y + 16, _mm256_add_ps(_mm256_mul_ps(d, lanes_ps<2>(v)), m));
  _mm256_storeu_ps(y + 24, _mm256_add_ps(_mm256_mul_ps(d, lanes_ps<3>(v)), m));
}
// y[0..32) = d * v - m (k-quants subtract the scaled min).
inline void store_affine_sub(float* y, __m256i v, __m256 d, __m256 m) {
  _mm256_storeu_ps(y + 0, _mm256_sub_ps(_mm256_mul_ps(d, lanes_ps<0>(v)), m));
  _mm256_storeu_ps(y + 8, _mm256_sub_ps(_mm256_mul_ps(d, lanes_ps<1>(v)), m));
  _mm256_storeu_ps(y + 16, _mm256_sub_ps(_mm256_mul_ps(d, lanes_ps<2>(v)), m));
  _mm256_storeu_ps(y + 24, _mm256_sub_ps(_mm256_mul_ps(d, lanes_ps<3>(v)), m));
}

__m256 bcast_f16(const uint8_t* p) {
  return _mm256_set1_ps(load_f16(p));
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

void deq_q4_0(const BlockQ4_0* b, float* y, int64_t nb) {
  const __m256i eight = _mm256_set1_epi8(8);
  for (int64_t i = 0; i < nb; ++i, y += QK) {
    store_scaled(y, _mm256_sub_epi8(nibbles16(b[i].qs), eight), bcast_f16(b[i].d));
  }
}

void deq_q4_1(const BlockQ4_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK) {
    store_affine(y, nibbles16(b[i].qs), bcast_f16(b[i].d), bcast_f16(b[i].m));
  }
}

void deq_q5_0(const BlockQ5_0* b, float* y, int64_t nb) {
  const __m256i sixteen = _mm256_set1_epi8(16);
  for (int64_t i = 0; i < nb; ++i, y += QK) {
    const __m256i q = _mm256_or_si256(nibbles16(b[i].qs), bit4_from_bits(load_u32(b[i].qh)));
    store_scaled(y, _mm256_sub_epi8(q, sixteen), bcast_f16(b[i].d));
  }
}

void deq_q5_1(const BlockQ5_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK) {
    const __m256i q = _mm256_or_si256(nibbles16(b[i].qs), bit4_from_bits(load_u32(b[i].qh)));
    store_affine(y, q, bcast_f16(b[i].d), bcast_f16(b[i].m));
  }
}

void deq_q8_0(const BlockQ8_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK) store_scaled(y, load32(b[i].qs), bcast_f16(b[i].d));
}

void deq_q4_k(const BlockQ4_K* b, float* y, int64_t nb) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int64_t i = 0; i < nb; ++i) {
    float ds[8], dm[8];
    k_scales(b[i].d, b[i].dmin, b[i].scales, ds, dm);
    for (int s = 0; s < 8; s += 2, y += 64) {
      const __m256i q = load32(b[i].qs + 16 * s);
      const __m256i lo = _mm256_and_si256(q, low);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
      store_affine_sub(y, lo, _mm256_set1_ps(ds[s]), _mm256_set1_ps(dm[s]));
      store_affine_sub(y + 32, hi, _mm256_set1_ps(ds[s + 1]), _mm256_set1_ps(dm[s + 1]));
    }
  }
}

void deq_q5_k(const BlockQ5_K* b, float* y, int64_t nb) {
  const __m256i low = _mm256_set1_epi8(0x0F), sixteen = _mm256_set1_epi8(0x10);
  for (int64_t i = 0; i < nb; ++i) {
    float ds[8], dm[8];
    k_scales(b[i].d, b[i].dmin, b[i].scales, ds, dm);
    const __m256i qh = load32(b[i].qh);
    // Fifth bit of sub-block s: bit s of each qh byte, moved to 0x10.
    auto bit4 = [&](int s) {
      const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << s));
      const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
      return _mm256_and_si256(set, sixteen);
    };
    for (int s = 0; s < 8; s += 2, y += 64) {
      const __m256i q = load32(b[i].qs + 16 * s);
      const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, low), bit4(s));
      const __m256i hi =
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), low), bit4(s + 1));
      store_affine_sub(y, lo, _mm256_set1_ps(ds[s]), _mm256_set1_ps(dm[s]));
      store_affine_sub(y + 32, hi, _mm256_set1_ps(ds[s + 1]), _mm256_set1_ps(dm[s + 1]));
    }
  }
}

void deq_q6_k(const BlockQ6_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d);
    for (int h = 0; h < 2; ++h) {
      __m256i q[4];
      q6_half(b[i].ql + 64 * h, b[i].qh + 32 * h, q);
      const int8_t* sc = b[i].scales + 8 * h;
      for (int k = 0; k < 4; ++k, y += 32) {
        store_scaled2(y, q[k], _mm256_set1_ps(d * static_cast<float>(sc[2 * k])),
                      _mm256_set1_ps(d * static_cast<float>(sc[2 * k + 1])));
      }
    }
  }
}

}  // namespace

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
    default:
      unsupported("dequantize_row", t);
  }
}

}  // namespace kvs
