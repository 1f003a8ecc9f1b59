#include "kvs/kv/page.h"

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
}

void kv_quantize_head(DType t, const float* x, uint8_t* dst, int32_t d) {
  if (t == DType::F16) return quantize_row(t, x, dst, d);
  const size_t quants = row_bytes(t, 32) - 2;
  const int32_t nb = d / 32;
  uint8_t blk[kMaxBlock];
  for (int32_t b = 0; b < nb; ++b) {
    quantize_row(t, x + 32 * b, blk, 32);
    std::memcpy(dst + 2 * b, blk, 2);
    std::memcpy(dst + 2 * nb + quants * b, blk + 2, quants);
  }
}

void kv_dequantize_head(DType t, const uint8_t* src, float* y, int32_t d) {
  if (t == DType::F16) return dequantize_row(t, src, y, d);
  const size_t quants = row_bytes(t, 32) - 2;
  const int32_t nb = d / 32;
  uint8_t blk[kMaxBlock];
  for (int32_t b = 0; b < nb; ++b) {
    std::memcpy(blk, src + 2 * b, 2);
    std::memcpy(blk + 2, src + 2 * nb + quants * b, quants);
    dequantize_row(t, blk, y + 32 * b, 32);
  }
}

DType parse_kv_type(const char* text, const char* flag) {
  std::string_view s(text);
  if (s == "f16") return DType::F16;
  if (s == "q8_0") return DType::Q8_0;
  if (s == "q4_0") return DType::Q4_0;
  fail(flag, ": KV cache type '", s, "' is not supported (supported: f16, q8_0, q4_0)");
}

}  // namespace kvs
