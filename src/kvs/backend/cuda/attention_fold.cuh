// The decode fold (attention_decode.cu): the partials of a call's spans, one per (span, query
// head), merged into the running state in span order, by a kernel of its own (decode_fold) or
// inside the tensor-core decode's launch (decode_tc).
#pragma once

#include "kvs/backend/cuda/attention_tile.cuh"

namespace kvs::cuda {

// Device code of internal linkage: each file's kernels inline their own copy, as they did when
// all were in one file (the same machine code).
namespace {

// A decode partial of one (span, query head): [max, sum, non-empty, unused, output[d]], rows
// 16-byte aligned (d % 32 == 0) so the fold copies them in 16-byte pieces.
constexpr int kPartO = 4;
__host__ __device__ constexpr size_t part_stride(int d) {
  return static_cast<size_t>(d) + kPartO;
}

// One span in the fold: the state times ea plus the span times eb (ea 1, eb 0 for an empty
// span, whose partial is not even read; ea 0, eb 1 for the first span taken). `before` and
// `after` are the running max before and after the span.
struct FoldStep {
  float ea, eb;
};
__device__ __forceinline__ FoldStep fold_step(bool live, bool first, float before, float after,
                                              float pm) {
  return {!live   ? 1.0f
          : first ? 0.0f
                  : expf(before - after),
          !live   ? 0.0f
          : first ? 1.0f
                  : expf(pm - after)};
}
__device__ __forceinline__ float fold_out(float o, FoldStep f, float cur) {
  return fmaf(o, f.ea, f.eb != 0.0f ? cur * f.eb : 0.0f);
}
// The end of a decode fold: the output (normalised after the last call, and quantized for the
// next product) and the state.
__device__ __forceinline__ void fold_write(const Geo& g, int h, int i, float m, float l, float o) {
  const float v = g.last ? o / l : o;
  g.out[h * g.d + i] = v;
  if (i == 0) g.acc[2 * h] = m, g.acc[2 * h + 1] = l;
  if (g.xq) {  // called by whole warps, a warp's lanes on 32 dimensions of one head
    const size_t b = static_cast<size_t>(h * g.d + i) / 32,
                 nb = static_cast<size_t>(g.n_head * g.d) / 32;
    quantize_x_block(v, i % 32, reinterpret_cast<XBlock*>(g.xq) + b,
                     reinterpret_cast<XMeta*>(g.xq + nb * sizeof(XBlock)) + b);
  }
}

// Decode, step 2: fold the partials of every span into the running state, in span order. A
// warp per (head, 32 output dimensions), a lane per dimension. The state's max only grows, so
// the max after each span is a prefix max, and the factors that rescale the state and the
// span's partial depend on maxima alone: the warp computes them for a chunk of kChunk spans at
// once (a scan over its lanes, kChunk / 32 spans a lane, the same expf of the same differences
// as a one-by-one fold, so the chunk's size does not change the result), and the only serial
// work left is the sum and the output, one multiply-add per span. A span is merged (o * ea +
// cur * eb), taken as the first (nothing before it) or skipped (empty). The fold reads every
// partial once (megabytes a layer at long contexts) and does little with it, so its speed is
// the bytes in flight: the chunks come by cp.async into a ring of kStages. It runs as a kernel
// of its own (decode_fold) or inside the attention's launch, behind its spans (decode_tc).
__device__ __forceinline__ void cp_async_cg16(void* dst, const void* src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
}
// Shared memory of one fold warp: outputs [kStages][kChunk][32] floats, span heads
// [kStages][kChunk] and the chunk's factors [kChunk], float4 each.
__host__ __device__ constexpr int fold_bytes(int chunk, int stages) {
  return stages * chunk * (32 * 4 + 16) + chunk * 16;
}
// The fold of head h, dimensions [32 db, 32 db + 32), by one warp; ready(c) returns once the
// partials of chunk c are written (the attention's launch) or at once (a launch of its own).
template <int kChunk, int kStages, class Ready>
__device__ __forceinline__ void fold_run(const Geo& g, const float* part, int h, int db,
                                         uint8_t* smem, Ready ready) {
  constexpr int kPer = kChunk / 32;
  auto so = reinterpret_cast<float(*)[kChunk][32]>(smem);  // the chunk's outputs
  auto sm = reinterpret_cast<float4(*)[kChunk]>(smem + kStages * kChunk * 32 * 4);
  float4* sf = reinterpret_cast<float4*>(smem + kStages * kChunk * (32 * 4 + 16));
  const int lane = threadIdx.x % 32, i = db * 32 + lane, n = g.n_spans;
  const size_t stride = part_stride(g.d), step = stride * g.n_head;
  float m = g.first ? 0.0f : g.acc[2 * h], l = g.first ? 0.0f : g.acc[2 * h + 1];
  float o = l != 0.0f ? g.out[h * g.d + i] : 0.0f;
  // Before the chunk: the running max (-inf while nothing was taken) and whether any is.
  float run_max = l != 0.0f ? m : -INFINITY;
  bool any = l != 0.0f;
  const float* base = part + h * stride;
  const int n_chunks = (n + kChunk - 1) / kChunk;
  // Chunk c into stage c % kStages, one commit group each (empty past the end): the heads of
  // the lane's spans, and 16-byte pieces of the outputs, 8 a span.
  const auto issue = [&](int c) {
    if (c < n_chunks) {
      ready(c);
      const int s0 = c * kChunk, st = c % kStages;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int s = kPer * lane + j;
        if (s0 + s < n) cp_async_cg16(&sm[st][s], base + (s0 + s) * step);
      }
      const float* src = base + kPartO + db * 32 + 4 * (lane % 8);
#pragma unroll
      for (int j = 0; j < kChunk / 4; ++j) {
        const int s = lane / 8 + 4 * j;
        if (s0 + s < n) cp_async_cg16(&so[st][s][4 * (lane % 8)], src + (s0 + s) * step);
      }
    }
    cp_commit();
  };
#pragma unroll
  for (int c = 0; c < kStages; ++c) issue(c);
  for (int c = 0; c < n_chunks; ++c) {
    cp_wait<kStages - 1>();  // chunk c has landed
    __syncwarp();
    const int s0 = c * kChunk, st = c % kStages;
    // The lane's spans kPer lane + j: their maxima and sums, and the running max and count of
    // the live ones within the lane's run.
    float pm[kPer], pl[kPer], run[kPer];
    bool live[kPer];
    int cnt[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int s = kPer * lane + j;
      const bool in = s0 + s < n;
      const float4 head = in ? sm[st][s] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      pm[j] = head.x, pl[j] = head.y;
      live[j] = in && head.z != 0.0f;  // an empty span's other values are garbage
      const float r = j ? run[j - 1] : -INFINITY;
      run[j] = live[j] ? fmaxf(r, pm[j]) : r;
      cnt[j] = (j ? cnt[j - 1] : 0) + (live[j] ? 1 : 0);
    }
    // Over the lanes: the max and count of the runs up to the lane's (inclusive), then those
    // before it joined with the state's max.
    float after = run[kPer - 1];
    int taken = cnt[kPer - 1];
#pragma unroll
    for (int k = 1; k < 32; k *= 2) {
      const float x = __shfl_up_sync(0xffffffffu, after, k);
      const int y = __shfl_up_sync(0xffffffffu, taken, k);
      if (lane >= k) after = fmaxf(after, x), taken += y;
    }
    float before = __shfl_up_sync(0xffffffffu, after, 1);
    int prior = __shfl_up_sync(0xffffffffu, taken, 1);
    if (lane == 0) before = -INFINITY, prior = 0;
    before = fmaxf(before, run_max);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {  // span kPer lane + j: the max before and after it
      const float b = j ? fmaxf(before, run[j - 1]) : before, a = fmaxf(before, run[j]);
      const int p = prior + (j ? cnt[j - 1] : 0);
      const FoldStep f = fold_step(live[j], !any && p == 0, b, a, pm[j]);
      sf[kPer * lane + j] = make_float4(f.ea, f.eb, live[j] ? pl[j] * f.eb : 0.0f, 0.0f);
    }
    run_max = fmaxf(run_max, __shfl_sync(0xffffffffu, after, 31));
    any = any || __shfl_sync(0xffffffffu, taken, 31) > 0;
    __syncwarp();
    // The serial part: one multiply-add per span for the sum and for the output, the span's
    // factors one broadcast load (a skipped span's output, never copied, is not read: its eb
    // is 0).
#pragma unroll
    for (int s = 0; s < kChunk; ++s) {
      const float4 x = sf[s];
      l = fmaf(l, x.x, x.z);
      o = fold_out(o, FoldStep{x.x, x.y}, so[st][s][lane]);
    }
    __syncwarp();  // the stage is refilled now
    issue(c + kStages);
  }
  fold_write(g, h, i, any ? run_max : m, l, o);
}

}  // namespace

}  // namespace kvs::cuda
