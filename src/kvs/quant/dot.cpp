// dot_row: fused dequantize + dot for decode matvecs, f32 accumulation. Per block the integer
// levels are dotted with x first and scaled once: sum_i (d q_i + m) x_i = d sum q_i x_i +
// m sum x_i. That reorders the float rounding relative to dequantize-then-dot, nothing else.
#include <immintrin.h>

#include "kvs/quant/blocks.h"
#include "kvs/quant/simd.h"

namespace kvs {
namespace {

using namespace quant;

// 8-lane partial sums of v[i] * x[i] over 32 lanes; dot16 over lanes 16h .. 16h+15.
inline __m256 dot32(__m256i v, const float* x) {
  __m256 s = _mm256_mul_ps(lanes_ps<0>(v), _mm256_loadu_ps(x));
  s = _mm256_fmadd_ps(lanes_ps<1>(v), _mm256_loadu_ps(x + 8), s);
  s = _mm256_fmadd_ps(lanes_ps<2>(v), _mm256_loadu_ps(x + 16), s);
  return _mm256_fmadd_ps(lanes_ps<3>(v), _mm256_loadu_ps(x + 24), s);
}
template <int h>
inline __m256 dot16(__m256i v, const float* x) {
  const __m256 s = _mm256_mul_ps(lanes_ps<2 * h>(v), _mm256_loadu_ps(x));
  return _mm256_fmadd_ps(lanes_ps<2 * h + 1>(v), _mm256_loadu_ps(x + 8), s);
}
inline __m256 sum32(const float* x) {
  const __m256 a = _mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8));
  const __m256 b = _mm256_add_ps(_mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24));
  return _mm256_add_ps(a, b);
}

__m256 bcast_f16(const uint8_t* p) {
  return _mm256_set1_ps(load_f16(p));
}

float dot_f32(const float* w, const float* x, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 16), _mm256_loadu_ps(x + i + 16), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 24), _mm256_loadu_ps(x + i + 24), a3);
  }
  for (; i + 8 <= n; i += 8)
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
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
    a0 = _mm256_fmadd_ps(widen(w + 2 * i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(widen(w + 2 * i + 16), _mm256_loadu_ps(x + i + 8), a1);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(widen(w + 2 * i), _mm256_loadu_ps(x + i), a0);
  float s = hsum(_mm256_add_ps(a0, a1));
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, w + 2 * i, 2);
    s += (bf ? bf16_to_f32(h) : f16_to_f32(h)) * x[i];
  }
  return s;
}

float dot_q4_0(const BlockQ4_0* b, const float* x, int64_t nb) {
  const __m256i eight = _mm256_set1_epi8(8);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    const __m256 s = dot32(_mm256_sub_epi8(nibbles16(b[i].qs), eight), x);
    acc = _mm256_fmadd_ps(bcast_f16(b[i].d), s, acc);
  }
  return hsum(acc);
}

float dot_q4_1(const BlockQ4_1* b, const float* x, int64_t nb) {
  __m256 acc = _mm256_setzero_ps(), accm = acc;
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    acc = _mm256_fmadd_ps(bcast_f16(b[i].d), dot32(nibbles16(b[i].qs), x), acc);
    accm = _mm256_fmadd_ps(bcast_f16(b[i].m), sum32(x), accm);
  }
  return hsum(_mm256_add_ps(acc, accm));
}

float dot_q5_0(const BlockQ5_0* b, const float* x, int64_t nb) {
  const __m256i sixteen = _mm256_set1_epi8(16);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    const __m256i q = _mm256_or_si256(nibbles16(b[i].qs), bit4_from_bits(load_u32(b[i].qh)));
    acc = _mm256_fmadd_ps(bcast_f16(b[i].d), dot32(_mm256_sub_epi8(q, sixteen), x), acc);
  }
  return hsum(acc);
}

float dot_q5_1(const BlockQ5_1* b, const float* x, int64_t nb) {
  __m256 acc = _mm256_setzero_ps(), accm = acc;
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    const __m256i q = _mm256_or_si256(nibbles16(b[i].qs), bit4_from_bits(load_u32(b[i].qh)));
    acc = _mm256_fmadd_ps(bcast_f16(b[i].d), dot32(q, x), acc);
    accm = _mm256_fmadd_ps(bcast_f16(b[i].m), sum32(x), accm);
  }
  return hsum(_mm256_add_ps(acc, accm));
}

float dot_q8_0(const BlockQ8_0* b, const float* x, int64_t nb) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
  int64_t i = 0;
  // Two blocks per step: two independent accumulators hide the FMA latency.
  for (; i + 2 <= nb; i += 2, x += 2 * QK) {
    acc0 = _mm256_fmadd_ps(bcast_f16(b[i].d), dot32(load32(b[i].qs), x), acc0);
    acc1 = _mm256_fmadd_ps(bcast_f16(b[i + 1].d), dot32(load32(b[i + 1].qs), x + QK), acc1);
  }
  if (i < nb) acc0 = _mm256_fmadd_ps(bcast_f16(b[i].d), dot32(load32(b[i].qs), x), acc0);
  return hsum(_mm256_add_ps(acc0, acc1));
}

float dot_q4_k(const BlockQ4_K* b, const float* x, int64_t nb) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  __m256 acc = _mm256_setzero_ps(), accm = acc;
  for (int64_t i = 0; i < nb; ++i) {
    float ds[8], dm[8];
    k_scales(b[i].d, b[i].dmin, b[i].scales, ds, dm);
    for (int s = 0; s < 8; s += 2, x += 64) {
      const __m256i q = load32(b[i].qs + 16 * s);
      const __m256i lo = _mm256_and_si256(q, low);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
      acc = _mm256_fmadd_ps(_mm256_set1_ps(ds[s]), dot32(lo, x), acc);
      acc = _mm256_fmadd_ps(_mm256_set1_ps(ds[s + 1]), dot32(hi, x + 32), acc);
      accm = _mm256_fmadd_ps(_mm256_set1_ps(dm[s]), sum32(x), accm);
      accm = _mm256_fmadd_ps(_mm256_set1_ps(dm[s + 1]), sum32(x + 32), accm);
    }
  }
  return hsum(_mm256_sub_ps(acc, accm));
}

float dot_q5_k(const BlockQ5_K* b, const float* x, int64_t nb) {
  const __m256i low = _mm256_set1_epi8(0x0F), sixteen = _mm256_set1_epi8(0x10);
  __m256 acc = _mm256_setzero_ps(), accm = acc;
  for (int64_t i = 0; i < nb; ++i) {
    float ds[8], dm[8];
    k_scales(b[i].d, b[i].dmin, b[i].scales, ds, dm);
    const __m256i qh = load32(b[i].qh);
    auto bit4 = [&](int s) {
      const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << s));
      return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit), sixteen);
    };
    for (int s = 0; s < 8; s += 2, x += 64) {
      const __m256i q = load32(b[i].qs + 16 * s);
      const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, low), bit4(s));
      const __m256i hi =
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), low), bit4(s + 1));
      acc = _mm256_fmadd_ps(_mm256_set1_ps(ds[s]), dot32(lo, x), acc);
      acc = _mm256_fmadd_ps(_mm256_set1_ps(ds[s + 1]), dot32(hi, x + 32), acc);
      accm = _mm256_fmadd_ps(_mm256_set1_ps(dm[s]), sum32(x), accm);
      accm = _mm256_fmadd_ps(_mm256_set1_ps(dm[s + 1]), sum32(x + 32), accm);
    }
  }
  return hsum(_mm256_sub_ps(acc, accm));
}

float dot_q6_k(const BlockQ6_K* b, const float* x, int64_t nb) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d);
    for (int h = 0; h < 2; ++h) {
      __m256i q[4];
      q6_half(b[i].ql + 64 * h, b[i].qh + 32 * h, q);
      const int8_t* sc = b[i].scales + 8 * h;
      for (int k = 0; k < 4; ++k, x += 32) {
        const __m256 d0 = _mm256_set1_ps(d * static_cast<float>(sc[2 * k]));
        const __m256 d1 = _mm256_set1_ps(d * static_cast<float>(sc[2 * k + 1]));
        acc0 = _mm256_fmadd_ps(d0, dot16<0>(q[k], x), acc0);
        acc1 = _mm256_fmadd_ps(d1, dot16<1>(q[k], x + 16), acc1);
      }
    }
  }
  return hsum(_mm256_add_ps(acc0, acc1));
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
    default:
      unsupported("dot_row", t);
  }
}

}  // namespace kvs
