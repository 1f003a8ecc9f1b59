// IEEE half and bfloat16 conversions (host side). F16C does the rounding in hardware.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace kvs {

inline float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
// The vector form of _cvtss_sh, which clang defines as a macro with a compound literal.
inline uint16_t f32_to_f16(float f) {
  const __m128i h = _mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT);
  return static_cast<uint16_t>(_mm_extract_epi16(h, 0));
}

inline float bf16_to_f32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace kvs
