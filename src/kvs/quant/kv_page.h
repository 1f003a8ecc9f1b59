// Page layout of the KV cache and spans over it. A page holds P token positions of one layer:
// P K rows, then P V rows; a row holds all KV heads of one token in the cache type, each head's
// slice of the same size as head_dim values of that type (head sizes are multiples of 32). An
// f16 slice is the values; a quantized one (q8_0, q4_0) holds the f16 scales of its head_dim / 32
// blocks first, then their quants in block order, as the blocks would store them: the quants
// start 4-byte aligned wherever the slice does, so a GPU reads them as whole words (in the
// blocks' own layout every other q8_0 block's quants sit 2 bytes off).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvs/quant/types.h"

namespace kvs {

struct KvLayout {
  DType k_type = DType::F16, v_type = DType::F16;
  int32_t page_size = 256;  // tokens per page
  int32_t n_head_kv = 0, head_dim = 0;
  size_t k_row = 0, v_row = 0;    // bytes per token, all heads
  size_t k_head = 0, v_head = 0;  // bytes per token and head
  size_t page_bytes() const { return static_cast<size_t>(page_size) * (k_row + v_row); }
  size_t v_offset() const { return static_cast<size_t>(page_size) * k_row; }

  static KvLayout make(DType k, DType v, int32_t page_size, int32_t n_head_kv, int32_t head_dim);
};

// A run of cached tokens of one layer: `n` positions starting at logical position `start`,
// held by a page frame. Attention computes one partial per span and merges them in logical order.
struct Span {
  const uint8_t* page = nullptr;
  int32_t start = 0;
  int32_t n = 0;
};

// One head's slice of a K or V row from d values, and back (the same rounding as
// quantize_row / dequantize_row of the same values).
void kv_quantize_head(DType t, const float* x, uint8_t* dst, int32_t d);
void kv_dequantize_head(DType t, const uint8_t* src, float* y, int32_t d);

// KV cache types accepted by -ctk/-ctv.
DType parse_kv_type(const char* text, const char* flag);

}  // namespace kvs
