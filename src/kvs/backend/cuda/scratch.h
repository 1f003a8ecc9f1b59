// The CUDA device's prefill scratch: what passes of more than kMaxSliceTok rows need beside the
// activations, sized from the model's matrices.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvs/quant/kv_page.h"
#include "kvs/model/weights.h"

namespace kvs::cuda {

// f16 copies of a whole matrix and of its input rows for cuBLAS, and the prefill attention's
// f16 chunks of a quantized cache; and of any pass, a Gated DeltaNet layer's conv rows and
// chunk products.
struct PrefillScratch {
  size_t w16 = 0, x16 = 0, kv16 = 0, spans16 = 0, gdn = 0;
  static size_t align(size_t n) { return (n + 255) / 256 * 256; }
  bool operator==(const PrefillScratch&) const = default;
  size_t bytes() const {
    return align(w16) + align(x16) + align(kv16) + align(spans16) + align(gdn);
  }
};

// For passes of n_tok rows through the layers and n_out_tok through the output matrix, over at
// most max_spans spans (0: no attention over a quantized cache).
PrefillScratch prefill_scratch_of(const Weights& w, int64_t n_tok, int64_t n_out_tok,
                                  int64_t max_spans);

// What Device::reserve allocates, each part a buffer of its own: prefill_scratch_of's, x
// quantized for kMaxSliceTok rows whatever n_tok (a prefill's short chunk too), and the
// decode's partials of max_spans spans.
struct Reserved {
  PrefillScratch scratch;
  size_t xq = 0, part = 0;
  size_t bytes() const;  // as allocated (Ctx::grown)
};
Reserved reserved_of(const Weights& w, int64_t n_tok, int64_t n_out_tok, int64_t max_spans,
                     int32_t n_head, int32_t head_dim);

// The phase arena's scratch (Device::prefill_scratch): the layers' products only, the output
// matrix seeing one row a sequence, which reserve() covers; a quantized cache's f16 chunks
// take what max_spans pages need, up to kKv16Bytes.
PrefillScratch workspace_scratch_of(const Weights& w, int64_t n_tok, int64_t max_spans,
                                    const KvLayout& kv);

}  // namespace kvs::cuda
