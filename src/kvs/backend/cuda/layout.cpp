// Rows from the file layout to the device layout of layout.h.
#include "kvs/backend/cuda/layout.h"

#include <cstring>

#include "kvs/quant/blocks.h"

namespace kvs::cuda {
namespace {

using quant::QK_K;

// The element orders of layout.h, from 32 codes of a sub-block (only their low bits are kept).
void put_nibbles(const uint8_t* c, uint8_t* dst) {
  for (int j = 0; j < 16; ++j) dst[j] = static_cast<uint8_t>((c[j] & 15) | (c[j + 16] << 4));
}
void put_crumbs(const uint8_t* c, uint8_t* dst) {
  for (int e = 0; e < 32; ++e) dst[4 * (e / 16) + e % 4] |= (c[e] & 3) << (2 * ((e / 4) % 4));
}
void put_bits(const uint8_t* c, uint8_t* dst) {
  for (int e = 0; e < 32; ++e) dst[e % 4] |= (c[e] & 1) << (e / 4);
}

// A KHead from the 6-bit a_s, b_s and the f16 d and dmin (null: zero).
void put_khead(const int* a, const int* b, const uint8_t* d, const uint8_t* dmin, uint8_t* dst) {
  for (int s = 0; s < 8; ++s) {
    dst[s] = static_cast<uint8_t>((a[s] & 15) | ((b[s] & 15) << 4));
    dst[8 + s / 2] |= static_cast<uint8_t>(((a[s] >> 4) | ((b[s] >> 4) << 2)) << (4 * (s % 2)));
  }
  std::memcpy(dst + 12, d, 2);
  if (dmin) std::memcpy(dst + 14, dmin, 2);
}

// Super-block i of a row (file bytes b) into its group: quants, high bits and scales of its 8
// sub-blocks, the lanes 8 (i % 4) + s.
void pack_super(DType t, const uint8_t* b, uint8_t* grp, int i) {
  const Packed pk = packed(t);
  const int q4 = i % 4;
  uint8_t* scales = grp + 32 * pk.lane_bytes();
  uint8_t lo[32] = {},
          hi[32] = {};  // codes of one sub-block: the quants' bits and those above them
  for (int s = 0; s < 8; ++s) {
    const int h = s / 4, k = s % 4;  // q6_k, q3_k, q2_k: half h, its 32-element part k
    for (int e = 0; e < 32; ++e) {
      switch (t) {
        case DType::Q4_K:
          lo[e] = b[16 + 32 * (s / 2) + e] >> (4 * (s & 1));
          break;
        case DType::Q5_K:
          lo[e] = b[48 + 32 * (s / 2) + e] >> (4 * (s & 1));
          hi[e] = b[16 + e] >> s;
          break;
        case DType::Q6_K:
          lo[e] = b[64 * h + (k & 1) * 32 + e] >> (4 * (k / 2));
          hi[e] = b[128 + 32 * h + e] >> (2 * k);
          break;
        case DType::Q3_K:
          lo[e] = b[32 + 32 * h + e] >> (2 * k);
          hi[e] = b[e] >> (4 * h + k);
          break;
        case DType::Q2_K:
          lo[e] = b[16 + 32 * h + e] >> (2 * k);
          break;
        case DType::IQ4_XS:
          lo[e] = e < 16 ? b[8 + 16 * s + e] : b[8 + 16 * s + e - 16] >> 4;
          break;
        default:
          fail("pack_super: ", dtype_name(t));
      }
    }
    const int lane = 8 * q4 + s;
    uint8_t* q = grp + lane * pk.quant;
    uint8_t* hb = grp + 32 * pk.quant + lane * pk.high;
    if (pk.quant == 16)
      put_nibbles(lo, q);
    else
      put_crumbs(lo, q);
    if (t == DType::Q6_K) put_crumbs(hi, hb);
    if (t == DType::Q5_K || t == DType::Q3_K) put_bits(hi, hb);
  }
  switch (t) {
    case DType::Q4_K:
    case DType::Q5_K: {
      int a[8], m[8];
      for (int s = 0; s < 8; ++s) quant::scale_min_k4(s, b + 4, a[s], m[s]);
      return put_khead(a, m, b, b + 2, scales + 16 * q4);
    }
    case DType::Q3_K: {
      int a[8], c[8];
      for (int s = 0; s < 8; ++s)
        a[s] = quant::scale_q3_k(2 * s, b + 96) + 32,
        c[s] = quant::scale_q3_k(2 * s + 1, b + 96) + 32;
      return put_khead(a, c, b + 108, nullptr, scales + 16 * q4);
    }
    case DType::Q6_K:
      std::memcpy(scales + 16 * q4, b + 192, 16);
      std::memcpy(scales + 64 + 2 * q4, b + 208, 2);
      return;
    case DType::Q2_K:
      std::memcpy(scales + 16 * q4, b, 16);
      std::memcpy(scales + 64 + 4 * q4, b + 80, 4);
      return;
    default:  // iq4_xs
      std::memcpy(scales + 8 * q4, b, 8);
  }
}

}  // namespace

size_t device_pitch(DType t, int64_t n_in) {
  const Packed pk = packed(t);
  if (pk.quant == 0) return (row_bytes(t, n_in) + 15) / 16 * 16;
  return static_cast<size_t>((n_in + 1023) / 1024) * static_cast<size_t>(pk.stride());
}

void pack_row(DType t, const uint8_t* src, uint8_t* dst, int64_t n_in, size_t pitch) {
  const Packed pk = packed(t);
  std::memset(dst, 0, pitch);
  if (pk.quant == 0) {
    std::memcpy(dst, src, row_bytes(t, n_in));
    return;
  }
  if (k_quant(t)) {
    const size_t block = row_bytes(t, QK_K);
    for (int64_t i = 0; i < n_in / QK_K; ++i)
      pack_super(t, src + static_cast<size_t>(i) * block,
                 dst + static_cast<size_t>(i / 4) * static_cast<size_t>(pk.stride()),
                 static_cast<int>(i % 4));
    return;
  }
  const int64_t nb = n_in / 32;
  const size_t block = row_bytes(t, 32);
  const size_t head = t == DType::Q4_1 ? 4 : 2;  // d (and m) before the quants
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* s = src + static_cast<size_t>(b) * block;
    uint8_t* g = dst + static_cast<size_t>(b / 32) * static_cast<size_t>(pk.stride());
    const int l = static_cast<int>(b % 32);
    std::memcpy(g + pk.quant * l, s + head, static_cast<size_t>(pk.quant));
    std::memcpy(g + 32 * pk.quant + 2 * l, s, 2);                                 // d
    if (t == DType::Q4_1) std::memcpy(g + 32 * pk.quant + 64 + 2 * l, s + 2, 2);  // m
  }
}

}  // namespace kvs::cuda
