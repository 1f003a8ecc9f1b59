// Integer matrix products of the CPU backend: the activations are quantized once per product
// to int8 per block of 32 (a float scale, and the block's sum for the formats with mins or
// offsets), and each weight block meets them in integer dot products (AVX2, or AVX-VNNI /
// AVX-512 VNNI where the CPU has them). An output is one fixed sequence of operations per (row,
// token): the same integers on every instruction set, then the same float steps in block order.
// So a token's result does not depend on the batch, the row split or the CPU's extensions.
#pragma once

#include <cstdint>

#include "kvs/backend/device.h"

namespace kvs::cpu {

// 32 activations x_i ~ d q_i.
struct XBlock {
  int8_t q[32];
  float d;
  float s8;  // d * sum q_i / 8: an eighth for each lane of the kernels' accumulators
};

enum class DotIsa { Avx2, AvxVnni, Avx512Vnni };

// The best instruction set of this CPU; whether it can run `isa`.
DotIsa best_dot_isa();
bool cpu_has(DotIsa isa);

// Whether `t` has an integer kernel (other formats dequantize to f32).
bool has_int_dot(DType t);

// xq[t][n / 32] = x[t][n] by blocks: d = max |x_i| / 127, q_i = round(x_i / d) (n % 32 == 0).
void quantize_x(const float* x, int64_t n_tok, int64_t n, XBlock* xq);

// y[t][r] = row r of w . token t for the rows [r0, r0 + nr) and the n_tok tokens of xq
// ([n_tok][w.n_in / 32]); y is [n_tok][w.n_out]. has_int_dot(w.type) must hold.
void int_matmul_rows(const Matrix& w, const XBlock* xq, float* y, int64_t n_tok, int64_t r0,
                     int64_t nr, DotIsa isa);

}  // namespace kvs::cpu
