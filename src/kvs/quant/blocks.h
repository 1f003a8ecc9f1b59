// GGML block layouts (ggml-common.h), byte for byte, shared by the CPU kernels. Every field is a
// byte array, so a block may sit at any address; f16 scales are read with memcpy.
#pragma once

#include <cstdint>
#include <cstring>

#include "kvs/quant/types.h"
#include "kvs/util/error.h"
#include "kvs/util/fp16.h"

namespace kvs::quant {

constexpr int QK = 32;     // elements per block of q4_0 ... q8_0
constexpr int QK_K = 256;  // elements per k-quant super-block

struct BlockQ4_0 {
  uint8_t d[2];
  uint8_t qs[QK / 2];  // element j in the low nibble of qs[j], element j + 16 in the high one
};
struct BlockQ4_1 {
  uint8_t d[2], m[2];
  uint8_t qs[QK / 2];
};
struct BlockQ5_0 {
  uint8_t d[2];
  uint8_t qh[4];  // bit j: fifth bit of element j
  uint8_t qs[QK / 2];
};
struct BlockQ5_1 {
  uint8_t d[2], m[2];
  uint8_t qh[4];
  uint8_t qs[QK / 2];
};
struct BlockQ8_0 {
  uint8_t d[2];
  int8_t qs[QK];
};
// 8 sub-blocks of 32 with 6-bit scales and mins packed in `scales`.
struct BlockQ4_K {
  uint8_t d[2], dmin[2];
  uint8_t scales[12];
  uint8_t qs[QK_K / 2];  // 64 elements per 32 bytes: sub-block 2i low nibbles, 2i+1 high
};
struct BlockQ5_K {
  uint8_t d[2], dmin[2];
  uint8_t scales[12];
  uint8_t qh[QK_K / 8];  // bit s of qh[l]: fifth bit of element l of sub-block s
  uint8_t qs[QK_K / 2];
};
// 16 sub-blocks of 16 with int8 scales; elements are 6 bit, split into ql (4) and qh (2).
struct BlockQ6_K {
  uint8_t ql[QK_K / 2];
  uint8_t qh[QK_K / 4];
  int8_t scales[QK_K / 16];
  uint8_t d[2];
};
// 16 sub-blocks of 16; scales[j]: 4-bit scale (low nibble) and min (high nibble) of sub-block j.
// Element 32k + l of half h (128 elements) is bits 2k, 2k+1 of qs[32h + l].
struct BlockQ2_K {
  uint8_t scales[QK_K / 16];
  uint8_t qs[QK_K / 4];
  uint8_t d[2], dmin[2];
};
// 16 sub-blocks of 16 with 6-bit scales (minus 32) packed in `scales`; levels -4..3: the low two
// bits as in q2_k, the third in bit 4h + k of hmask[l], set for the non-negative levels.
struct BlockQ3_K {
  uint8_t hmask[QK_K / 8];
  uint8_t qs[QK_K / 4];
  uint8_t scales[12];
  uint8_t d[2];
};
// Non-linear 4-bit: the nibbles index kIq4nlValues; nibble packing as in q4_0.
struct BlockIQ4_NL {
  uint8_t d[2];
  uint8_t qs[QK / 2];
};
// 8 iq4_nl sub-blocks of 32 under one f16 scale, each with a 6-bit scale (minus 32): the low 4
// bits in scales_l (sub-block 2i low nibble, 2i + 1 high), the high 2 in bits 2j, 2j+1 of scales_h.
struct BlockIQ4_XS {
  uint8_t d[2];
  uint8_t scales_h[2];
  uint8_t scales_l[QK_K / 64];
  uint8_t qs[QK_K / 2];  // sub-block j: qs[16j .. 16j + 16), packed as in q4_0
};
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockIQ4_NL) == 18 &&
              sizeof(BlockIQ4_XS) == 136);

// ggml's kvalues_iq4nl: the 16 levels of iq4_nl and iq4_xs.
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);

inline float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}
inline void store_f16(uint8_t* p, float f) {
  const uint16_t h = f32_to_f16(f);
  std::memcpy(p, &h, 2);
}

// Scale and min of sub-block j (0..7) of a q4_k/q5_k super-block (ggml's get_scale_min_k4):
// sub-blocks 0-3 keep 6 bits in bytes 0-7; 4-7 keep 4 bits in bytes 8-11 and 2 in the top bits.
inline void scale_min_k4(int j, const uint8_t* q, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Sub-block scales d * sc and mins dmin * m of a q4_k/q5_k super-block.
inline void k_scales(const uint8_t* dp, const uint8_t* dminp, const uint8_t* packed, float* ds,
                     float* dm) {
  const float d = load_f16(dp), dmin = load_f16(dminp);
  for (int s = 0; s < 8; ++s) {
    int sc, m;
    scale_min_k4(s, packed, sc, m);
    ds[s] = d * static_cast<float>(sc);
    dm[s] = dmin * static_cast<float>(m);
  }
}

// Scale of sub-block j (0..15) of a q3_k super-block, -32..31: the low 4 bits in the nibbles of
// bytes 0-7 (j < 8 low, else high), the high 2 in bits 2 (j / 4) of byte 8 + j % 4.
inline int scale_q3_k(int j, const uint8_t* packed) {
  const int lo = (packed[j % 8] >> (4 * (j / 8))) & 0xF;
  const int hi = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

// Scale of sub-block j (0..7) of an iq4_xs super-block, -32..31.
inline int scale_iq4_xs(int j, const BlockIQ4_XS& b) {
  const int lo = (b.scales_l[j / 2] >> (4 * (j % 2))) & 0xF;
  const int hi = ((b.scales_h[0] | (b.scales_h[1] << 8)) >> (2 * j)) & 3;
  return (lo | (hi << 4)) - 32;
}

// Elements per block of the formats the kernels handle; 0 for the others.
inline int64_t block_elems(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
      return 1;
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0:
    case DType::IQ4_NL:
      return QK;
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::IQ4_XS:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      return QK_K;
    default:
      return 0;
  }
}

[[noreturn]] inline void unsupported(const char* op, DType t) {
  fail(op, ": type ", dtype_name(t), " is not supported by the CPU kernels");
}

// Fails unless n is a whole number of t's blocks; returns the number of blocks.
inline int64_t check_blocks(const char* op, DType t, int64_t n) {
  const int64_t b = block_elems(t);
  if (b == 0) unsupported(op, t);
  KVS_CHECK(n >= 0 && n % b == 0, op, ": ", n, " elements is not a whole number of ", dtype_name(t),
            " blocks of ", b);
  return n / b;
}

}  // namespace kvs::quant
