// Integer matrix products of the CPU backend. The activations are quantized once per product
// as the CUDA backend quantizes them: per block of 32, x ~ dx (h + l / 254) with two int8 planes
// h and l (a relative error below 2e-5 of the block's largest value), kept as 254 h + l in int16.
// A row is taken in groups of eight sub-blocks of 32 (256 elements), one float lane per
// sub-block. Per output and group, in group order:
//   S_j = sum over sub-block j of level . (254 h + l), exact in int32 (two sums, its first and
//         last 16, for the formats with scales per 16);
//   acc = fma(float(S), dw * d, acc) with d = dx / 254 (each half in turn: first, then last);
//   with mins, acc = fma(min, s, acc) (s: dx sum (h + l / 254) of the sub-block or its halves);
// then the 8 lanes' sum. The integers are exact however a kernel gathers them and the float
// steps are the same lanes' on every instruction set (AVX2, AVX-VNNI, AVX-512 VNNI), so a
// token's result does not depend on the batch, the tile, the row split, the thread count or
// the CPU's extensions. The float work is a few steps per 256 elements and token, where the
// integer products take 16 multiply-adds: a verify step or a batch costs little more per token
// than the products themselves.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvs/backend/cpu/isa.h"
#include "kvs/backend/device.h"

namespace kvs::cpu {

// 256 activations (blocks 0 .. 7 of 32) of one token, quantized; blocks past the row's end are
// zeros.
struct alignas(64) XGroup {
  // 254 h + l, 16 vectors of 8 int32 lanes: vector 2 k + a (k = 0 .. 7, a = 0, 1) holds in lane
  // j elements 4 k + a and 4 k + a + 2 of block j (v_index), the order in which the kernels
  // widen a sub-block's level bytes (dword k of its 32 bytes, the even bytes then the odd).
  int16_t v[256];
  float d[8];          // block j's dx / 254: the scale of its integers
  float s[3][8];       // dx sum (h + l / 254) over block j, its first 16, its last 16 (mins)
  int32_t nsum[3][8];  // -sum (254 h + l) over the same (offset levels: S = sum u x - 2^s sum x)
};
static_assert(sizeof(XGroup) == 768);

// Where element e (0 .. 31) of block j sits in XGroup::v.
constexpr int v_index(int j, int e) {
  return (2 * (e / 4) + e % 2) * 16 + 2 * j + (e % 4) / 2;
}
// The same in a row's last group when it holds at most 4 blocks: vectors 0 .. 7 only, elements
// 16 .. 31 of block j in lane j + 4 (the kernels then take 8 products a token, not 16).
constexpr int v_half_index(int j, int e) {
  return (2 * (e % 16 / 4) + e % 2) * 16 + 2 * (j + 4 * (e / 16)) + (e % 4) / 2;
}
// Whether group g of n_sub sub-blocks is such a half group.
constexpr bool half_group(int64_t g, int64_t n_sub) {
  return 8 * g + 4 >= n_sub;
}

// XGroups per token for n activations (n % 32 == 0).
inline int64_t x_groups(int64_t n) {
  return (n / 32 + 7) / 8;
}

// The instruction sets of isa.h: the products' kernels and attention's choose alike.
using DotIsa = Isa;
inline DotIsa best_dot_isa() {
  return best_isa();
}

// Whether `t` has an integer kernel (f32, f16 and bf16 keep float products).
bool has_int_dot(DType t);

// The CPU layout of the 32-element formats (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl), which the
// CPU backend's place_weights repacks their rows into: per group of 8 blocks their scales
// together and the level bytes in the order the kernels take them (quant_lanes.h, Blocks), so
// that a group's read is a few loads, not a transpose of 8 blocks. Other types keep the file's
// rows. cpu_row_bytes(): a row's bytes in it (a short last group of at most 4 blocks is a half
// group, of more is padded to a whole group).
bool cpu_repacked(DType t);
size_t cpu_row_bytes(DType t, int64_t n_in);
// A row of n_in elements into the CPU layout (dst: cpu_row_bytes) and back (dst: row_bytes).
void pack_row(DType t, const uint8_t* src, uint8_t* dst, int64_t n_in);
void unpack_row(DType t, const uint8_t* src, uint8_t* dst, int64_t n_in);

// xq[t][x_groups(n)] = x[t][n] (n % 32 == 0), block by block: dx = max |x_i| / 127,
// h_i = round(x_i / dx), l_i = round((x_i / dx - h_i) 254), with CUDA's roundings.
void quantize_x(const float* x, int64_t n_tok, int64_t n, XGroup* xq);

// y[t ldy + r] = row r0 + r of w . token t for r < nr and the n_tok tokens of xq
// ([n_tok][x_groups(w.n_in)]). has_int_dot(w.type) must hold, and w's rows be in the CPU
// layout.
void int_matmul_rows(const Matrix& w, const XGroup* xq, int64_t n_tok, int64_t r0, int64_t nr,
                     float* y, int64_t ldy, DotIsa isa);

}  // namespace kvs::cpu
