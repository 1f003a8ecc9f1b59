// quantize_row: AVX2 fast paths for the KV cache formats (f16, q8_0, q4_0), bit exact to the
// scalar reference quantizers in ref.cpp, which handle the remaining formats.
#include <immintrin.h>

#include "kvs/quant/blocks.h"
#include "kvs/quant/ref.h"
#include "kvs/quant/simd.h"

namespace kvs {
namespace {

using namespace quant;

// 32 int32 lanes (values fit int8) -> 32 bytes in element order.
inline __m256i pack_i8(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
  // The packs work per 128-bit lane; the permute puts the 4-byte groups back in order.
  return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd),
                                     _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

void q_f16(const float* x, uint8_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + 2 * i), h);
  }
  for (; i < n; ++i) store_f16(y + 2 * i, x[i]);
}

void q_q8_0(const float* x, BlockQ8_0* b, int64_t nb) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  // roundf (half away from zero) = trunc(v + copysign(0.49999997f, v)); plain + 0.5 would round
  // 0.49999997 up.
  const __m256 half = _mm256_set1_ps(0.49999997f);
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    __m256 v[4], amax = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(x + 8 * k);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[k]));
    }
    const float d = hmax(amax) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_f16(b[i].d, d);
    __m256i q[4];
    for (int k = 0; k < 4; ++k) {
      const __m256 s = _mm256_mul_ps(v[k], _mm256_set1_ps(id));
      const __m256 r = _mm256_add_ps(s, _mm256_or_ps(_mm256_and_ps(s, sign), half));
      q[k] = _mm256_cvttps_epi32(r);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(b[i].qs), pack_i8(q[0], q[1], q[2], q[3]));
  }
}

void q_q4_0(const float* x, BlockQ4_0* b, int64_t nb) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    __m256 v[4], amax = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(x + 8 * k);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[k]));
    }
    // The reference keeps the sign of the first element of largest magnitude.
    const float amax_s = hmax(amax);
    const __m256 am = _mm256_set1_ps(amax_s);
    uint32_t hit = 0;
    for (int k = 0; k < 4; ++k) {
      const __m256 eq = _mm256_cmp_ps(_mm256_andnot_ps(sign, v[k]), am, _CMP_EQ_OQ);
      hit |= static_cast<uint32_t>(_mm256_movemask_ps(eq)) << (8 * k);
    }
    const float max = amax_s > 0.0f ? x[__builtin_ctz(hit)] : 0.0f;  // +0 for an all-zero block
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_f16(b[i].d, d);
    __m256i q[4];
    for (int k = 0; k < 4; ++k) {
      const __m256 s = _mm256_add_ps(_mm256_mul_ps(v[k], _mm256_set1_ps(id)), _mm256_set1_ps(8.5f));
      q[k] = _mm256_min_epi32(_mm256_cvttps_epi32(s), _mm256_set1_epi32(15));
    }
    const __m256i p = pack_i8(q[0], q[1], q[2], q[3]);
    const __m128i lo = _mm256_castsi256_si128(p), hi = _mm256_extracti128_si256(p, 1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b[i].qs), _mm_or_si128(lo, _mm_slli_epi16(hi, 4)));
  }
}

}  // namespace

void quantize_row(DType t, const float* x, void* y, int64_t n) {
  const int64_t nb = check_blocks("quantize_row", t, n);
  switch (t) {
    case DType::F16:
      return q_f16(x, static_cast<uint8_t*>(y), n);
    case DType::Q8_0:
      return q_q8_0(x, static_cast<BlockQ8_0*>(y), nb);
    case DType::Q4_0:
      return q_q4_0(x, static_cast<BlockQ4_0*>(y), nb);
    default:
      return quantize_row_ref(t, x, y, n);
  }
}

}  // namespace kvs
