// Attention on the CPU over spans of a paged cache (kernels.h's attention, for the CPU backend
// and host mode; the CPU's side of split attention): each span's partials by the span kernels
// (span_attention.h) on the pool's threads, merged into the running state in logical span order.
#pragma once

#include "kvs/backend/device.h"
#include "kvs/util/threadpool.h"

namespace kvs::cpu {

// One token's partials over each span of a (a.n_tok == 1, a.pos its position), every query
// head: part + (s * a.n_head + h) * part_stride(head size), the rows span_partials writes; on
// the threads of `pool`.
void decode_partials(const AttentionArgs& a, ThreadPool& pool, float* part);

// Folds a.n_spans spans' partials (rows as decode_partials writes them) into the running state
// of a's one token in span order, as attention() folds those it computes (a.first starts the
// state, a.last normalises a.out).
void fold_partials(const AttentionArgs& a, const float* part);

// The partial of a.n_spans spans' partials together: folded head by head in span order, as
// fold_partials does, into one row per head (out + h * part_stride(head size)); on `pool`.
void merge_partials(const AttentionArgs& a, const float* part, ThreadPool& pool, float* out);

}  // namespace kvs::cpu
