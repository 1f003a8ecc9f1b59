#include "kvs/backend/cuda/scratch.h"

#include <cuda_fp16.h>

#include <algorithm>

#include "kvs/backend/cuda/kernels.h"
#include "kvs/backend/cuda/weights.h"
#include "kvs/backend/cuda/backend.h"
#include "kvs/backend/device.h"

namespace kvs {
namespace cuda {

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

size_t Reserved::bytes() const {
  size_t n = 0;
  for (size_t b : {scratch.w16, scratch.x16, scratch.kv16, scratch.spans16, scratch.gdn, xq, part})
    n += Ctx::grown(b);
  return n;
}

Reserved reserved_of(const Weights& w, int64_t n_tok, int64_t n_out_tok, int64_t max_spans,
                     int32_t n_head, int32_t head_dim) {
  Reserved r;
  r.scratch = prefill_scratch_of(w, n_tok, n_out_tok, max_spans);
  for (const LayerWeights& l : w.layers)
    for (const Matrix* m : layer_matrices(l))
      if (m->n_out > 0) r.xq = std::max(r.xq, xq_bytes(m->n_in, kMaxSliceTok));
  r.xq = std::max(r.xq, xq_bytes(w.output.n_in, kMaxSliceTok));
  if (max_spans > 0)
    r.part = static_cast<size_t>(max_spans) * n_head * (head_dim + 3) * sizeof(float);
  return r;
}

PrefillScratch workspace_scratch_of(const Weights& w, int64_t n_tok, int64_t max_spans,
                                    const KvLayout& kv) {
  PrefillScratch p = prefill_scratch_of(w, n_tok, 0, 0);
  const bool f16 = kv.k_type == DType::F16 && kv.v_type == DType::F16;
  if (max_spans > 0 && n_tok > kMaxSliceTok && !f16) {
    const size_t page16 =
        2 * static_cast<size_t>(kv.page_size) * kv.n_head_kv * kv.head_dim * sizeof(__half);
    p.kv16 = std::min(kKv16Bytes, static_cast<size_t>(max_spans) * page16);
    p.spans16 = static_cast<size_t>(std::min<int64_t>(max_spans, kMaxSpans16)) * sizeof(Span);
  }
  return p;
}

}  // namespace cuda

CudaFootprint cuda_footprint(const Weights& w, const ScratchArgs& a) {
  CudaFootprint f;
  f.weights = cuda::placed_bytes(w);
  f.reserved =
      cuda::reserved_of(w, a.n_tok, a.n_out_tok, a.max_spans, a.n_head, a.head_dim).bytes();
  if (a.n_batch > 0)
    f.workspace = cuda::workspace_scratch_of(w, a.n_batch, a.max_spans, a.kv).bytes();
  return f;
}

}  // namespace kvs
