#include "kvs/backend/cuda/scratch.h"

#include <cuda_fp16.h>

#include <algorithm>

#include "kvs/backend/cuda/kernels.h"
#include "kvs/backend/cuda/weights.h"
#include "kvs/backend/device.h"

namespace kvs::cuda {

PrefillScratch prefill_scratch_of(const Weights& w, int64_t n_tok, int64_t n_out_tok,
                                  int64_t max_spans) {
  PrefillScratch p;
  const auto need = [&](const Matrix& m, int64_t rows) {
    if (rows <= kMaxSliceTok || m.n_out == 0) return;
    p.w16 = std::max(p.w16, static_cast<size_t>(m.n_in * m.n_out) * sizeof(__half));
    p.x16 = std::max(p.x16, static_cast<size_t>(m.n_in * rows) * sizeof(__half));
  };
  for (const LayerWeights& l : w.layers) {
    for (const Matrix* m : layer_matrices(l)) need(*m, n_tok);
    if (l.ssm_qkv.n_out > 0)
      p.gdn = std::max(p.gdn, delta_net_scratch(n_tok, l.ssm_qkv.n_out, l.ssm_alpha.n_out));
  }
  need(w.output, n_out_tok);
  if (max_spans > 0 && n_tok > kMaxSliceTok)
    p.kv16 = kKv16Bytes, p.spans16 = kMaxSpans16 * sizeof(Span);
  return p;
}

}  // namespace kvs::cuda
