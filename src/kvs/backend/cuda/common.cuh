// Shared pieces of the CUDA kernels: error checks, and the decoding of 32-element sub-blocks of
// every weight and KV format (a k-quant super-block is 8 sub-blocks), used by the matrix-vector
// products, the dequantize-for-GEMM kernel, the embedding and attention alike.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "kvs/quant/types.h"
#include "kvs/util/error.h"

#define KVS_CUDA_CHECK(call)                                                                 \
  do {                                                                                       \
    const cudaError_t e_ = (call);                                                           \
    if (e_ != cudaSuccess)                                                                   \
      ::kvs::fail("CUDA: ", #call, " failed: ", cudaGetErrorString(e_), " (", __FILE__, ":", \
                  __LINE__, ")");                                                            \
  } while (0)

namespace kvs::cuda {

#ifdef KVS_TRACE
// A timing build only (cmake -DKVS_TRACE=ON; never the default, whose kernels it would
// change): thread 0 of every block records when it reached pdl_wait() and when the kernel
// before had finished, into a ring the device writes out at its end (KVS_TRACE=FILE), so that
// a step's chain is timed inside its graph at the GPU's own clocks (scripts/trace-chain.py).
struct TraceRec {
  unsigned long long grid, arrive, go;  // %gridid (one launch); %globaltimer, ns
  unsigned block, sm, blocks, threads;
};
struct Trace {
  TraceRec* rec = nullptr;
  unsigned long long* count = nullptr;
  unsigned long long cap = 0;
};
static __device__ Trace g_trace;  // one per translation unit, each set by its trace_bind_*

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Thread 0's slot in the ring, asked for before the wait so that the atomic's round trip
// overlaps it (after it, the block's first warp would stall on it); ~0 for the other threads.
__device__ __forceinline__ unsigned long long trace_slot() {
  if (threadIdx.x + threadIdx.y + threadIdx.z != 0 || g_trace.rec == nullptr) return ~0ull;
  return atomicAdd(g_trace.count, 1ull) & (g_trace.cap - 1);  // cap: a power of two
}

__device__ __forceinline__ void trace_block(unsigned long long slot, unsigned long long arrive) {
  if (slot == ~0ull) return;
  const unsigned long long go = global_ns();
  unsigned long long grid;
  unsigned sm;
  asm volatile("mov.u64 %0, %%gridid;" : "=l"(grid));
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  g_trace.rec[slot] = {grid,
                       arrive,
                       go,
                       blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z),
                       sm,
                       gridDim.x * gridDim.y * gridDim.z,
                       blockDim.x * blockDim.y * blockDim.z};
}
#define KVS_TRACE_BIND(fn)                                     \
  void fn(const Trace& t) {                                    \
    KVS_CUDA_CHECK(cudaMemcpyToSymbol(g_trace, &t, sizeof t)); \
  }
void trace_bind_attention_decode(const Trace& t);
void trace_bind_attention_decode_tc(const Trace& t);
void trace_bind_attention_prefill(const Trace& t);
void trace_bind_matmul(const Trace& t);
void trace_bind_ops(const Trace& t);
#endif

// Programmatic dependent launch (compute capability 9.0 on): every kernel is launched so that
// it may start while the kernel before it on the stream finishes (its blocks load and wait
// instead of the GPU idling between two kernels), and every kernel calls pdl_wait() before it
// touches memory that earlier work writes: that waits until the kernel before has finished
// and its writes are visible (a no-op when launched without the attribute). It then lets the
// next kernel launch. Weights and other inputs that no kernel writes may be read before it.
__device__ __forceinline__ void pdl_wait() {
#ifdef KVS_TRACE
  const unsigned long long arrive = global_ns(), slot = trace_slot();
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n griddepcontrol.launch_dependents;" ::: "memory");
#endif
#ifdef KVS_TRACE
  trace_block(slot, arrive);
#endif
}

// Whether launches use it: set once by the device (the GPU's compute capability, KVS_PDL=0).
inline bool& pdl_enabled() {
  static bool on = false;
  return on;
}

template <class... P, class... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            A&&... args) {
  cudaLaunchAttribute at[1] = {};
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = stream;
  cfg.attrs = at, cfg.numAttrs = pdl_enabled() ? 1 : 0;
  KVS_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...));
}

// Blocks of a kernel an SM holds at once with that much dynamic shared memory (which differs
// between cards: a consumer card's 100 KiB of shared memory holds fewer), asked of the GPU once
// per kernel and size.
template <class F>
int resident(F* kernel, int threads, size_t smem) {
  static std::mutex mu;
  static std::map<std::pair<const void*, size_t>, int> known;
  const std::lock_guard<std::mutex> lock(mu);
  const std::pair<const void*, size_t> key{reinterpret_cast<const void*>(kernel), smem};
  int& n = known[key];
  if (n == 0)
    KVS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem));
  return std::max(1, n);
}

__device__ __forceinline__ float h2f(const uint8_t* p) {
  const uint16_t u = static_cast<uint16_t>(p[0] | (p[1] << 8));
  return __half2float(__ushort_as_half(u));
}

// Scale and min of sub-block j of a q4_k/q5_k super-block.
__device__ __forceinline__ void scale_min(int j, const uint8_t* q, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Level i of iq4_nl/iq4_xs (ggml's kvalues_iq4nl), from the bytes of two words: no table in
// memory.
__device__ __forceinline__ float iq4_value(int i) {
  const uint64_t w = i < 8 ? 0xF6EADDCFBFAD9881ull : 0x7159453526190D01ull;
  return static_cast<float>(static_cast<int8_t>(w >> (8 * (i & 7))));
}

// Elements [32 sb, 32 sb + 32) of a row in format T, as f32.
template <DType T>
__device__ __forceinline__ void load_sub(const uint8_t* row, int sb, float* v) {
  if constexpr (T == DType::F32) {
    const float4* p = reinterpret_cast<const float4*>(row) + sb * 8;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float4 f = p[k];
      v[4 * k] = f.x, v[4 * k + 1] = f.y, v[4 * k + 2] = f.z, v[4 * k + 3] = f.w;
    }
  } else if constexpr (T == DType::F16) {
    const uint4* p = reinterpret_cast<const uint4*>(row + sb * 64);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint4 u = p[k];
      const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = __half22float2(h[i]);
        v[8 * k + 2 * i] = f.x, v[8 * k + 2 * i + 1] = f.y;
      }
    }
  } else if constexpr (T == DType::BF16) {
    const uint4* p = reinterpret_cast<const uint4*>(row + sb * 64);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint4 u = p[k];
      const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        v[8 * k + 2 * i] = __uint_as_float(w[i] << 16);
        v[8 * k + 2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
      }
    }
  } else if constexpr (T == DType::Q8_0) {
    const uint8_t* b = row + sb * 34;
    const float d = h2f(b);
#pragma unroll
    for (int j = 0; j < 32; ++j) v[j] = d * static_cast<float>(static_cast<int8_t>(b[2 + j]));
  } else if constexpr (T == DType::Q4_0) {
    const uint8_t* b = row + sb * 18;
    const float d = h2f(b);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const uint8_t q = b[2 + j];
      v[j] = d * static_cast<float>((q & 0xF) - 8);
      v[j + 16] = d * static_cast<float>((q >> 4) - 8);
    }
  } else if constexpr (T == DType::Q4_1) {
    const uint8_t* b = row + sb * 20;
    const float d = h2f(b), m = h2f(b + 2);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const uint8_t q = b[4 + j];
      v[j] = d * static_cast<float>(q & 0xF) + m;
      v[j + 16] = d * static_cast<float>(q >> 4) + m;
    }
  } else if constexpr (T == DType::Q5_0 || T == DType::Q5_1) {
    constexpr int kHas = T == DType::Q5_1 ? 2 : 0;
    const uint8_t* b = row + sb * (22 + kHas);
    const float d = h2f(b), m = kHas ? h2f(b + 2) : 0.0f;
    const uint8_t* qhp = b + 2 + kHas;
    const uint32_t qh =
        qhp[0] | (qhp[1] << 8) | (qhp[2] << 16) | (static_cast<uint32_t>(qhp[3]) << 24);
    const uint8_t* qs = qhp + 4;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
      const int q0 = (qs[j] & 0xF) | h0, q1 = (qs[j] >> 4) | h1;
      if constexpr (kHas) {
        v[j] = d * static_cast<float>(q0) + m;
        v[j + 16] = d * static_cast<float>(q1) + m;
      } else {
        v[j] = d * static_cast<float>(q0 - 16);
        v[j + 16] = d * static_cast<float>(q1 - 16);
      }
    }
  } else if constexpr (T == DType::Q4_K || T == DType::Q5_K) {
    constexpr bool k5 = T == DType::Q5_K;
    const uint8_t* b = row + (sb / 8) * (k5 ? 176 : 144);
    const int s = sb % 8;
    const float d = h2f(b), dmin = h2f(b + 2);
    int sc, m;
    scale_min(s, b + 4, sc, m);
    const float ds = d * static_cast<float>(sc), dm = dmin * static_cast<float>(m);
    const uint8_t* qh = b + 16;
    const uint8_t* q = b + (k5 ? 48 : 16) + 32 * (s / 2);
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      int x = (s & 1) ? (q[l] >> 4) : (q[l] & 0xF);
      if constexpr (k5) x |= ((qh[l] >> s) & 1) << 4;
      v[l] = ds * static_cast<float>(x) - dm;
    }
  } else if constexpr (T == DType::Q6_K) {
    const uint8_t* b = row + (sb / 8) * 210;
    const int s = sb % 8, h = s / 4, k = s % 4;
    const uint8_t* ql = b + 64 * h + (k & 1) * 32;
    const uint8_t* qh = b + 128 + 32 * h;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * h;
    const float d = h2f(b + 208);
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      const int lo = (k < 2) ? (ql[l] & 0xF) : (ql[l] >> 4);
      const int q = (lo | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
      v[l] = d * static_cast<float>(sc[l / 16 + 2 * k]) * static_cast<float>(q);
    }
  } else if constexpr (T == DType::IQ4_NL || T == DType::IQ4_XS) {
    constexpr bool xs = T == DType::IQ4_XS;
    const uint8_t* b = xs ? row + (sb / 8) * 136 : row + sb * 18;
    const uint8_t* qs = xs ? b + 8 + 16 * (sb % 8) : b + 2;
    float d = h2f(b);
    if constexpr (xs) {
      const int j = sb % 8;
      const int hi = ((b[2] | (b[3] << 8)) >> (2 * j)) & 3;
      d *= static_cast<float>((((b[4 + j / 2] >> (4 * (j % 2))) & 0xF) | (hi << 4)) - 32);
    }
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      v[j] = d * iq4_value(qs[j] & 0xF);
      v[j + 16] = d * iq4_value(qs[j] >> 4);
    }
  } else if constexpr (T == DType::Q2_K || T == DType::Q3_K) {
    // Elements 32k + l of half h: two bits at 2k of qs[32h + l], sub-block of 16 8h + 2k + l/16.
    constexpr bool k3 = T == DType::Q3_K;
    const uint8_t* b = row + (sb / 8) * (k3 ? 110 : 84);
    const int s = sb % 8, h = s / 4, k = s % 4;
    const uint8_t* qs = b + (k3 ? 32 : 16) + 32 * h;
    const float d = h2f(b + (k3 ? 108 : 80)), dmin = k3 ? 0.0f : h2f(b + 82);
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      const int j = 2 * s + l / 16, q = (qs[l] >> (2 * k)) & 3;
      if constexpr (k3) {
        const int sc = ((b[96 + j % 8] >> (4 * (j / 8))) & 0xF) |
                       (((b[104 + j % 4] >> (2 * (j / 4))) & 3) << 4);
        const int hi = (b[l] >> (4 * h + k)) & 1;
        v[l] = d * static_cast<float>(sc - 32) * static_cast<float>(q - (hi ? 0 : 4));
      } else {
        v[l] = d * static_cast<float>(b[j] & 0xF) * static_cast<float>(q) -
               dmin * static_cast<float>(b[j] >> 4);
      }
    }
  }
}

// Device layout of weight rows (place_weights). q4_0, q4_1 and q8_0 rows are cut into groups
// of 32 blocks (1024 elements, the last group zero-padded) laid out for the matrix-vector
// kernel, whose lane l takes block l of each group: the blocks' quants one after the other
// (lane l's 16 or 32 bytes at offset l times that size, in the file's order within a block),
// then the 32 f16 scales, then for q4_1 the 32 f16 mins. Other formats keep the file layout,
// rows padded to 16 bytes. KV pages always keep the file layout.
struct Packed {
  int quant = 0;   // bytes of quants per block; 0: not packed
  int scales = 0;  // bytes of scales (and mins) per group
  __host__ __device__ constexpr int stride() const { return 32 * quant + scales; }
};
__host__ __device__ constexpr Packed packed(DType t) {
  return t == DType::Q4_0   ? Packed{16, 64}
         : t == DType::Q4_1 ? Packed{16, 128}
         : t == DType::Q8_0 ? Packed{32, 64}
                            : Packed{};
}

// Elements [32 sb, 32 sb + 32) of a weight row of n_sub sub-blocks, as f32.
template <DType T>
__device__ __forceinline__ void load_w(const uint8_t* row, int n_sub, int sb, float* v) {
  constexpr Packed pk = packed(T);
  if constexpr (pk.quant != 0) {
    const uint8_t* g = row + static_cast<size_t>(sb / 32) * pk.stride();
    const int l = sb % 32;
    alignas(16)
        uint8_t q[pk.quant];  // the block's quants, by 16-byte loads (they are 16-byte aligned)
#pragma unroll
    for (int k = 0; k < pk.quant / 16; ++k)
      reinterpret_cast<uint4*>(q)[k] = reinterpret_cast<const uint4*>(g + pk.quant * l)[k];
    const float d = h2f(g + 32 * pk.quant + 2 * l);
    if constexpr (T == DType::Q8_0) {
#pragma unroll
      for (int j = 0; j < 32; ++j) v[j] = d * static_cast<float>(static_cast<int8_t>(q[j]));
    } else {
      const float m = T == DType::Q4_1 ? h2f(g + 32 * pk.quant + 64 + 2 * l) : 0.0f;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int lo = q[j] & 0xF, hi = q[j] >> 4;
        v[j] = T == DType::Q4_1 ? d * static_cast<float>(lo) + m : d * static_cast<float>(lo - 8);
        v[j + 16] =
            T == DType::Q4_1 ? d * static_cast<float>(hi) + m : d * static_cast<float>(hi - 8);
      }
    }
  } else {
    (void)n_sub;
    load_sub<T>(row, sb, v);
  }
}

// Calls f.template operator()<T>() for the runtime type t (the formats the kernels support).
template <class F>
void dispatch(DType t, F&& f) {
  switch (t) {
    case DType::F32:
      return f.template operator()<DType::F32>();
    case DType::F16:
      return f.template operator()<DType::F16>();
    case DType::BF16:
      return f.template operator()<DType::BF16>();
    case DType::Q8_0:
      return f.template operator()<DType::Q8_0>();
    case DType::Q4_0:
      return f.template operator()<DType::Q4_0>();
    case DType::Q4_1:
      return f.template operator()<DType::Q4_1>();
    case DType::Q5_0:
      return f.template operator()<DType::Q5_0>();
    case DType::Q5_1:
      return f.template operator()<DType::Q5_1>();
    case DType::Q4_K:
      return f.template operator()<DType::Q4_K>();
    case DType::Q5_K:
      return f.template operator()<DType::Q5_K>();
    case DType::Q6_K:
      return f.template operator()<DType::Q6_K>();
    case DType::Q2_K:
      return f.template operator()<DType::Q2_K>();
    case DType::Q3_K:
      return f.template operator()<DType::Q3_K>();
    case DType::IQ4_NL:
      return f.template operator()<DType::IQ4_NL>();
    case DType::IQ4_XS:
      return f.template operator()<DType::IQ4_XS>();
    default:
      fail("cuda: no kernels for type ", dtype_name(t));
  }
}

// The KV cache types.
template <class F>
void dispatch_kv(DType t, F&& f) {
  switch (t) {
    case DType::F16:
      return f.template operator()<DType::F16>();
    case DType::Q8_0:
      return f.template operator()<DType::Q8_0>();
    case DType::Q4_0:
      return f.template operator()<DType::Q4_0>();
    default:
      fail("cuda: no KV kernels for type ", dtype_name(t));
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// x quantized for the integer matrix-vector kernel (matmul.cu), per 32-element block:
// x ~ dx (h + l / 254) with int8 h and l, and the block's sum of that. The buffer of n blocks
// holds n XBlocks, then n XMetas.
struct XBlock {
  int8_t h[32], l[32];
};
struct XMeta {
  float dx, sum;  // sum = sum(h + l / 254), for the offsets of q4_0 and the mins of q4_1
};

// One block, held by a warp (lane = element): the rounding of h leaves |r| <= 1/2, which l
// keeps to 1/508 of dx. The same arithmetic wherever x is quantized (RMSNorm, SwiGLU, alone).
__device__ __forceinline__ void quantize_x_block(float v, int lane, XBlock* xb, XMeta* xm) {
  // Explicit roundings: the same bits whichever kernel inlines it.
  const float dx = __fdiv_rn(warp_max(fabsf(v)), 127.0f);
  const float id = dx != 0.0f ? __frcp_rn(dx) : 0.0f;
  const float s = __fmul_rn(v, id), h = rintf(s), l = rintf(__fmul_rn(__fsub_rn(s, h), 254.0f));
  xb->h[lane] = static_cast<int8_t>(h);
  xb->l[lane] = static_cast<int8_t>(l);
  const float sum = warp_sum(__fmaf_rn(l, 1.0f / 254.0f, h));
  if (lane == 0) *xm = XMeta{dx, sum};
}

}  // namespace kvs::cuda
