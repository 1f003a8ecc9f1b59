// Device layout of weight rows (CudaDevice::place_weights), shared by the host's repacking
// (layout.cpp) and the kernels (common.cuh).
//
// Quantized rows but q5_0/q5_1 are cut into groups of 1024 elements (the last zero-padded) laid
// out for the matrix-vector kernel, whose lane l takes the 32-element sub-block l of each group
// (block l; for k-quants and iq4_xs sub-block l % 8 of super-block l / 8):
//   quants  32 x `quant` bytes, lane l's at l * quant;
//   high    32 x `high` bytes, lane l's at 32 quant + l * high (the bits above the quants);
//   scales  `scales` bytes: the blocks' or super-blocks' scales, as each format keeps them.
// Element e of a sub-block (e < 32) is kept in one of three orders, chosen so that the elements
// 4v .. 4v + 3 (one int32 of x for __dp4a) come out of a word with one shift and one mask:
//   nibbles  16 bytes: e < 16 in the low nibble of byte e, e >= 16 in the high one of e - 16
//            (the file order of q4_0 and iq4);
//   crumbs   2 words, 2 bits each: e in word e / 16, byte e % 4, bits 2 ((e / 4) % 4);
//   bits     1 word: e at bit 8 (e % 4) + e / 4.
// Formats (quants / high, then the scales of each block or super-block, in group order):
//   q4_0, q4_1, iq4_nl  nibbles; f16 d of each block (q4_1: then f16 m of each)
//   q8_0                32 int8; f16 d of each block
//   q4_k, q5_k          nibbles / q5_k: fifth bits in bit order; a KHead each
//   q3_k                crumbs / third bits in bit order; a KHead each (dmin 0)
//   q6_k                nibbles / the top two bits as crumbs; 16 int8 scales each, then f16 d
//                       each, then 8 zero bytes (groups stay 16-byte aligned)
//   q2_k                crumbs; the file's 16 scale bytes each, then f16 d and dmin each
//   iq4_xs              nibbles; the file's first 8 bytes each (d, scales_h, scales_l)
// A KHead (16 bytes) holds two 6-bit numbers a_s, b_s per sub-block s < 8 (q4_k, q5_k: scale
// and min; q3_k: the scales of the sub-blocks of 16 2s and 2s + 1, plus 32): byte s their low
// 4 bits (a low), the nibble at bits 4s of bytes 8-11 their high 2 (a low), then f16 d and dmin.
// Other formats keep the file layout, rows padded to 16 bytes. KV pages always keep the file
// layout.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvs/quant/types.h"

namespace kvs::cuda {

struct Packed {
  int quant = 0;   // bytes of quants per sub-block; 0: not packed
  int high = 0;    // bytes of high bits per sub-block
  int scales = 0;  // bytes of scales per group
  constexpr int lane_bytes() const { return quant + high; }
  constexpr int stride() const { return 32 * (quant + high) + scales; }
};
constexpr Packed packed(DType t) {
  switch (t) {
    case DType::Q4_0:
    case DType::IQ4_NL:
      return {16, 0, 64};
    case DType::Q4_1:
      return {16, 0, 128};
    case DType::Q8_0:
      return {32, 0, 64};
    case DType::Q4_K:
      return {16, 0, 64};
    case DType::Q5_K:
      return {16, 4, 64};
    case DType::Q6_K:
      return {16, 8, 80};
    case DType::Q3_K:
      return {8, 4, 64};
    case DType::Q2_K:
      return {8, 0, 80};
    case DType::IQ4_XS:
      return {16, 0, 32};
    default:
      return {};
  }
}
// The formats whose scales are per super-block of 256 (a group holds 4).
constexpr bool k_quant(DType t) {
  return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K || t == DType::Q3_K ||
         t == DType::Q2_K || t == DType::IQ4_XS;
}

// Bytes of a row of n_in elements on the device.
size_t device_pitch(DType t, int64_t n_in);
// A row of n_in elements from the file layout to the device layout (dst: pitch bytes).
void pack_row(DType t, const uint8_t* src, uint8_t* dst, int64_t n_in, size_t pitch);

}  // namespace kvs::cuda
