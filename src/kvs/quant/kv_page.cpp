#include "kvs/quant/kv_page.h"

#include <cstring>
#include <string_view>

#include "kvs/util/error.h"

namespace kvs {

KvLayout KvLayout::make(DType k, DType v, int32_t page_size, int32_t n_head_kv, int32_t head_dim) {
  KVS_CHECK(page_size >= 1 && page_size <= 65536, "--page-size ", page_size,
            " is out of range (1 to 65536)");
  KvLayout l;
  l.k_type = k;
  l.v_type = v;
  l.page_size = page_size;
  l.n_head_kv = n_head_kv;
  l.head_dim = head_dim;
  l.k_head = row_bytes(k, head_dim);
  l.v_head = row_bytes(v, head_dim);
  l.k_row = l.k_head * static_cast<size_t>(n_head_kv);
  l.v_row = l.v_head * static_cast<size_t>(n_head_kv);
  return l;
}

namespace {
constexpr size_t kMaxBlock = 34;  // bytes of a q8_0 block, the largest KV block

// A quantized head slice of d values (kv_page.h) and the blocks of its type, q8_0 or q4_0 (an f16
// scale, then `quants` bytes): where block b's scale and quants sit in the slice.
struct Slice {
  size_t quants;
  int32_t nb;
  Slice(DType t, int32_t d) : quants(t == DType::Q4_0 ? 16 : 32), nb(d / 32) {}
  size_t scale(int32_t b) const { return 2 * static_cast<size_t>(b); }
  size_t quant(int32_t b) const { return 2 * static_cast<size_t>(nb) + quants * b; }
};
}  // namespace

void kv_quantize_head(DType t, const float* x, uint8_t* dst, int32_t d) {
  if (t == DType::F16) return quantize_row(t, x, dst, d);
  const Slice s(t, d);
  uint8_t blk[kMaxBlock];
  for (int32_t b = 0; b < s.nb; ++b) {
    quantize_row(t, x + 32 * b, blk, 32);
    std::memcpy(dst + s.scale(b), blk, 2);
    std::memcpy(dst + s.quant(b), blk + 2, s.quants);
  }
}

void kv_dequantize_head(DType t, const uint8_t* src, float* y, int32_t d) {
  if (t == DType::F16) return dequantize_row(t, src, y, d);
  const Slice s(t, d);
  dequantize_split(t, src + s.scale(0), src + s.quant(0), y, s.nb);
}

DType parse_kv_type(const char* text, const char* flag) {
  std::string_view s(text);
  if (s == "f16") return DType::F16;
  if (s == "q8_0") return DType::Q8_0;
  if (s == "q4_0") return DType::Q4_0;
  fail(flag, ": KV cache type '", s, "' is not supported (supported: f16, q8_0, q4_0)");
}

}  // namespace kvs
