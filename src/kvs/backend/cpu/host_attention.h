// Attention on the host over pages in host memory: all the engine's host and split modes ask of
// the CPU (the CPU backend's own kv_write and attention are these too). Each span's partials by
// the span kernels (span_attention.h) on a pool's threads, merged in logical span order, so a
// page's place never changes the bits. The engine decides which pages and when; it includes no
// other header of backend/cpu.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvs/backend/device.h"
#include "kvs/util/threadpool.h"

namespace kvs::cpu {

// A partial row of one query head: max, sum, non-empty (1 or 0), 0, then the unnormalised
// output [d]. The CUDA decode's layout (rows of a multiple of 16 bytes), so that split
// attention hands the GPU the CPU's rows as they are (Device::fold).
constexpr int kPartHead = 4;
constexpr size_t part_stride(int32_t d) {
  return static_cast<size_t>(d) + kPartHead;
}

// Writes K and V rows of n_tok tokens ([n_tok][n_head_kv * head_dim] each) into their pages
// at the given slots, in the cache's types (kernels.cpp).
void kv_write(const KvLayout& l, const float* k, const float* v, int32_t n_tok,
              uint8_t* const* pages, const int32_t* slots);

// Attention of a's n_tok queries over its spans, causal by position, on the global pool
// (attention.cpp): host mode's whole layer, the CPU backend's attention.
void attention(const AttentionArgs& a);

// The partials of each of a's n_tok query rows (a.pos their positions) over each span of a,
// every query head: part + ((t * a.n_spans + s) * a.n_head + h) * part_stride(head size), the
// rows span_partials writes (each row's bits those of a call for it alone); on the threads of
// `pool`.
void decode_partials(const AttentionArgs& a, ThreadPool& pool, float* part);

// The partial of a.n_spans spans' partials together: folded head by head in span order, as
// fold_partials does, into one row per head (out + h * part_stride(head size)); on `pool`.
void merge_partials(const AttentionArgs& a, const float* part, ThreadPool& pool, float* out);

// Folds a.n_spans spans' partials of each of a's n_tok queries (rows as decode_partials writes
// them) into that query's running state in span order, as attention() folds those it computes
// (a.first starts the state, a.last normalises a.out).
void fold_partials(const AttentionArgs& a, const float* part);

}  // namespace kvs::cpu
