// Attention on the CPU over spans of a paged cache (kernels.h's attention, for the CPU backend
// and host mode; the CPU's side of split attention): each span's partials by the span kernels
// (span_attention.h) on the pool's threads, merged into the running state in logical span order.
#pragma once

#include <atomic>
#include <vector>

#include "kvs/backend/cpu/span_attention.h"
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

// One token's decode_partials and merge_partials (a.n_tok == 1) as tasks that a caller's own
// threads take in order, for a caller that keeps its threads in one region (split attention):
// the spans' partials into part, then each head's merge of them into out, a merge once every
// span's partials are done. The same bits as the two calls. prepare() on one thread, then
// work() on any number of them.
class DecodeTasks {
 public:
  // `threads`: how many will take tasks (the last spans are cut finer for them to finish
  // together); part: rows for a.n_spans spans.
  void prepare(const AttentionArgs& a, int32_t threads, float* part, float* out);
  // Runs tasks until none is left; true on the one thread that finished the last merge, when
  // out is complete.
  bool work();

 private:
  AttentionArgs a_;
  SpanKernels ks_;
  std::vector<int16_t> q16_;
  std::vector<float> step_;
  std::vector<int32_t> offset_;
  float* part_ = nullptr;
  float* out_ = nullptr;
  int32_t whole_ = 0;
  int64_t span_tasks_ = 0;
  std::atomic<int64_t> next_{0}, spans_done_{0}, merges_done_{0};
};

}  // namespace kvs::cpu
