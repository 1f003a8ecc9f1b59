// The code the decode and prefill attention kernels share (attention.cu says how the work is
// split): the geometry of a call, reading a KV head's row in its page format, asynchronous
// copies into shared memory and the tensor cores' f16 products.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvs/backend/cuda/common.cuh"
#include "kvs/backend/cuda/kernels.h"

namespace kvs::cuda {

constexpr int kMaxGroup = 8;  // query heads per kv head

// One attention call as the kernels see it: AttentionArgs with the layout's sizes in bytes.
struct Geo {
  const float* q;
  float* out;
  float* acc;
  const Span* spans;
  const int32_t* pos;
  int n_tok, n_spans, n_head, group, d;
  size_t k_row, v_row, k_head, v_head, v_offset;
  float scale;
  bool first, last;
  uint8_t* xq = nullptr;       // decode, last call: where the fold also writes out quantized
  bool fold_in_place = false;  // decode of one span on tensor cores: no separate fold
  int window = 0;              // AttentionArgs::window
};

// Device code of internal linkage: each file's kernels inline their own copy, as they did when
// all were in one file (the same machine code).
namespace {

// The first key position a query at pos sees (AttentionArgs::window), as the CPU kernel has it.
__device__ __forceinline__ int first_key(const Geo& g, int pos) {
  return g.window > 0 ? pos - g.window + 1 : 0;
}

__device__ __forceinline__ float h2f_16(const uint16_t* p) {
  return __half2float(__ushort_as_half(*p));
}

// A quantized head's slice (page.h): the f16 scale of block b, and where its quants begin (nb:
// the head's blocks).
__device__ __forceinline__ float kv_scale(const uint8_t* head, int b) {
  return h2f_16(reinterpret_cast<const uint16_t*>(head) + b);
}
template <DType T>
__device__ __forceinline__ const uint8_t* kv_quants(const uint8_t* head, int nb, int b) {
  return head + 2 * nb + (T == DType::Q8_0 ? 32 : 16) * b;
}

// Asynchronous copies global -> shared of w = 4, 8 or 16 bytes (both addresses aligned to w);
// w = 2 copies synchronously.
__device__ __forceinline__ void cp_async(void* dst, const void* src, int w) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if (w == 2)  // rows only 2-byte aligned (q4_0 rows of 32 elements): a plain copy
    *static_cast<uint16_t*>(dst) = *static_cast<const uint16_t*>(src);
  else if (w == 16)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
  else if (w == 8)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(d), "l"(src));
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src));
}
__device__ __forceinline__ void cp_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
// Waits until at most N of this thread's commit groups of copies are still in flight.
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// D = C + A B for one m16n8k16 tile: f16 inputs, f32 accumulators.
__device__ __forceinline__ void mma16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t h2u(float x, float y) {
  const __half2 h = __floats2half2_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// One ex2 instruction (flushing results below 2^-126 to zero) where expf takes several.
constexpr float kLog2e = 1.4426950408889634f;
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace

// The widest cp.async every K and V row of the layout allows (frames are 256-byte aligned).
inline int copy_width(const Geo& g) {
  const auto aligned = [&](size_t w) {
    return g.k_head % w == 0 && g.v_head % w == 0 && g.k_row % w == 0 && g.v_row % w == 0 &&
           g.v_offset % w == 0;
  };
  return aligned(16) ? 16 : aligned(8) ? 8 : aligned(4) ? 4 : 2;
}

// One token's attention (attention_decode.cu): g.xq set for the call that also quantizes.
void attention_decode(Ctx& c, Geo& g, const KvLayout& l, bool by_warp);
// The decode's fold alone, of g.n_spans partials at part (fold_partials).
void attention_fold(Ctx& c, const Geo& g, const float* part);
// Decode on tensor cores (attention_decode_tc.cu), head sizes 64, 128 and 256: launches the
// partials of g's spans into part, or folds a call of one span in place (g.fold_in_place);
// returns whether its launch also folds the partials.
bool launch_decode_tc(Ctx& c, Geo& g, const KvLayout& l, bool by_warp, float* part);
// Whether a block of the tensor-core decode of g's layout fits this GPU's shared memory (heads
// of 256 need more than the consumer cards give a block).
bool decode_tc_fits(const Ctx& c, const Geo& g, const KvLayout& l);
// Several tokens' attention (attention_prefill.cu).
void attention_prefill(Ctx& c, const Geo& g, const KvLayout& l);

}  // namespace kvs::cuda
