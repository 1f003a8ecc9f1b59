// Integer matrix products of the CPU backend. The activations are quantized once per product
// as the CUDA backend quantizes them: per block of 32, x ~ dx (h + l / 254) with two int8 planes
// h and l (a relative error below 2e-5 of the block's largest value). Each weight sub-block of
// 32 meets both planes in integer dot products (AVX2, or AVX-VNNI / AVX-512 VNNI where the CPU
// has them), 254 h.w + l.w is exact in int32, and the float work per output is one fixed
// sequence: 16 lanes (two sub-blocks at a time) accumulate in sub-block order, then one
// horizontal sum. Integers are the same on every instruction set and the float steps do not
// depend on the tile, so a token's result does not depend on the batch, the row split, the
// thread count or the CPU's extensions.
#pragma once

#include <cstdint>

#include "kvs/backend/cpu/isa.h"
#include "kvs/backend/device.h"

namespace kvs::cpu {

// 64 activations (two blocks of 32) of one token, quantized. Lane i of the kernels' 16 int32
// lanes covers elements 4i .. 4i + 3, so block b's lanes are 8b .. 8b + 7.
struct alignas(64) XPair {
  int8_t h[64], l[64];
  float d[16];   // block b's dx / 254 in its lanes: the scale of 254 h.w + l.w
  float s4[16];  // lanes 4i .. 4i + 3 (16 elements): a quarter of their dx sum(h + l / 254) each
  // 254 h + l (within int16) for the 256-bit kernels' vpmaddwd / vpdpwssd: block b's 32 as
  // v[32 b ..] = A then B, 16 each, where 128-bit half k of A holds elements 16k + 4g, 16k + 4g + 1
  // and that of B 16k + 4g + 2, 16k + 4g + 3 (g = 0 .. 3), so A's and B's pair sums add up to
  // the lanes' (v16_index).
  int16_t v[64];
};
static_assert(sizeof(XPair) == 384);

// Where element e (0 .. 31) of a block sits in its 32 entries of XPair::v.
constexpr int v16_index(int e) {
  const int k = e % 16, j = k % 4;
  return (j / 2) * 16 + (e / 16) * 8 + 2 * (k / 4) + j % 2;
}

// XPairs per token for n activations (n % 32 == 0); an odd last block is paired with zeros.
inline int64_t x_pairs(int64_t n) {
  return (n / 32 + 1) / 2;
}

// The instruction sets of isa.h: the products' kernels and attention's choose alike.
using DotIsa = Isa;
inline DotIsa best_dot_isa() {
  return best_isa();
}

// Whether `t` has an integer kernel (f32, f16 and bf16 keep float products).
bool has_int_dot(DType t);

// xq[t][x_pairs(n)] = x[t][n] (n % 32 == 0), block by block: dx = max |x_i| / 127,
// h_i = round(x_i / dx), l_i = round((x_i / dx - h_i) 254), with CUDA's roundings.
void quantize_x(const float* x, int64_t n_tok, int64_t n, XPair* xq);

// y[t ldy + r] = row r0 + r of w . token t for r < nr and the n_tok tokens of xq
// ([n_tok][x_pairs(w.n_in)]). has_int_dot(w.type) must hold.
void int_matmul_rows(const Matrix& w, const XPair* xq, int64_t n_tok, int64_t r0, int64_t nr,
                     float* y, int64_t ldy, DotIsa isa);

}  // namespace kvs::cpu
