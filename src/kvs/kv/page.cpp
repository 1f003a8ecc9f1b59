#include "kvs/kv/page.h"

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

DType parse_kv_type(const char* text, const char* flag) {
  std::string_view s(text);
  if (s == "f16") return DType::F16;
  if (s == "q8_0") return DType::Q8_0;
  if (s == "q4_0") return DType::Q4_0;
  fail(flag, ": KV cache type '", s, "' is not supported (supported: f16, q8_0, q4_0)");
}

}  // namespace kvs
