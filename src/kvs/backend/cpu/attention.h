// Attention on the CPU over spans of a paged cache (kernels.h's attention, for the CPU backend
// and host mode; the CPU's side of split attention): each span's partials by the span kernels
// (span_attention.h) on the pool's threads, merged into the running state in logical span order.
#pragma once

#include "kvs/backend/device.h"

namespace kvs::cpu {

// One token's partials over each span of a (a.n_tok == 1, a.pos its position), every query
// head: part + (s * a.n_head + h) * part_stride(head size), the rows span_partials writes.
void decode_partials(const AttentionArgs& a, float* part);

}  // namespace kvs::cpu
