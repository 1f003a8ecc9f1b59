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
      return QK;
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
