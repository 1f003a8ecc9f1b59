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
#include <unordered_map>
#include <utility>

#include "kvs/backend/cuda/layout.h"
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
void trace_bind_delta_net(const Trace& t);
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

// Dynamic shared memory above 48 KiB has to be allowed once per kernel.
template <class F>
void allow_smem(F* kernel, size_t bytes) {
  // Kernels of one signature share F, so the sizes are kept per kernel address.
  static std::mutex mu;
  static std::unordered_map<const void*, size_t> allowed;
  const std::lock_guard<std::mutex> lock(mu);
  const void* key = reinterpret_cast<const void*>(kernel);
  size_t& a = allowed[key];
  if (bytes <= a) return;
  KVS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(bytes)));
  a = bytes;
}

__device__ __forceinline__ float h2f(const uint8_t* p) {
  const uint16_t u = static_cast<uint16_t>(p[0] | (p[1] << 8));
  return __half2float(__ushort_as_half(u));
}

// Elements [32 sb, 32 sb + 32) of a row in format T, as f32 (the formats layout.h leaves in the
// file layout).
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
  }
}

__device__ __forceinline__ float h2f(uint32_t u) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(u & 0xFFFF)));
}

// x's bits moved from bit `from` to bit `to` (constants once the loops are unrolled).
__device__ __forceinline__ uint32_t move_bits(uint32_t x, int from, int to) {
  return to >= from ? x << (to - from) : x >> (from - to);
}

// The iq4 levels (ggml's kvalues_iq4nl) of the 4 codes in the low 4 nibbles of c, as int8
// bytes: the table's two halves are two pairs of words, picked from by byte permutes.
__device__ __forceinline__ uint32_t iq4_levels(uint32_t c) {
  const uint32_t i = c & 0x7777;  // the entry within a half
  const uint32_t lo = __byte_perm(0xBFAD9881u, 0xF6EADDCFu, i);
  const uint32_t hi = __byte_perm(0x26190D01u, 0x71594535u, i);
  return __byte_perm(lo, hi, 0x3210 | ((c >> 1) & 0x4444));  // bit 3 of a code: the upper half
}

// The formats of Sub. Levels are codes - kOffset (iq4: the table's); "halves" formats scale the
// elements 0-15 and 16-31 of a sub-block apart, "min" ones subtract a min: value = d q - m.
template <DType T>
constexpr bool kSubFormat = k_quant(T) || T == DType::IQ4_NL;
template <DType T>
constexpr bool kHalves = T == DType::Q6_K || T == DType::Q3_K || T == DType::Q2_K;
template <DType T>
constexpr bool kMin = T == DType::Q4_K || T == DType::Q5_K || T == DType::Q2_K;
template <DType T>
constexpr bool kIq4 = T == DType::IQ4_NL || T == DType::IQ4_XS;
template <DType T>
constexpr int kOffset = T == DType::Q6_K   ? 32
                        : T == DType::Q3_K ? 4
                                           : 0;

// One sub-block of a k-quant, iq4_xs or iq4_nl row in the layout of layout.h, as one lane
// holds it: its quants, high bits and the words of its scales.
template <DType T>
struct Sub {
  static constexpr Packed pk = packed(T);
  static constexpr int kHead = T == DType::IQ4_NL ? 1
                               : T == DType::Q6_K || T == DType::Q2_K || T == DType::IQ4_XS
                                   ? 2
                                   : 4;  // a KHead
  uint32_t q[pk.quant / 4];
  uint32_t h[pk.high ? pk.high / 4 : 1];
  uint32_t hd[kHead];

  // Sub-block `lane` of group grp (zeros unless ok).
  __device__ __forceinline__ void load(const uint8_t* grp, int lane, bool ok) {
    const uint8_t* qp = grp + pk.quant * lane;
    if constexpr (pk.quant == 16) {
      const uint4 v = ok ? __ldg(reinterpret_cast<const uint4*>(qp)) : make_uint4(0, 0, 0, 0);
      q[0] = v.x, q[1] = v.y, q[2] = v.z, q[3] = v.w;
    } else {
      const uint2 v = ok ? __ldg(reinterpret_cast<const uint2*>(qp)) : make_uint2(0, 0);
      q[0] = v.x, q[1] = v.y;
    }
    const uint8_t* hp = grp + 32 * pk.quant + pk.high * lane;
    if constexpr (pk.high == 8) {
      const uint2 v = ok ? __ldg(reinterpret_cast<const uint2*>(hp)) : make_uint2(0, 0);
      h[0] = v.x, h[1] = v.y;
    } else if constexpr (pk.high == 4) {
      h[0] = ok ? __ldg(reinterpret_cast<const unsigned*>(hp)) : 0u;
    }
    const uint8_t* sc = grp + 32 * pk.lane_bytes();
    const int sb = lane / 8, s = lane % 8;  // k-quants: super-block of the group, sub-block
    const auto u16 = [&](const uint8_t* p) -> uint32_t {
      return ok ? __ldg(reinterpret_cast<const unsigned short*>(p)) : 0u;
    };
    if constexpr (T == DType::IQ4_NL) {
      hd[0] = u16(sc + 2 * lane);
    } else if constexpr (T == DType::IQ4_XS) {
      const uint2 v = ok ? __ldg(reinterpret_cast<const uint2*>(sc + 8 * sb)) : make_uint2(0, 0);
      hd[0] = v.x, hd[1] = v.y;
    } else if constexpr (T == DType::Q6_K) {
      hd[0] = u16(sc + 16 * sb + 2 * s), hd[1] = u16(sc + 64 + 2 * sb);
    } else if constexpr (T == DType::Q2_K) {
      hd[0] = u16(sc + 16 * sb + 2 * s);
      hd[1] = ok ? __ldg(reinterpret_cast<const unsigned*>(sc + 64 + 4 * sb)) : 0u;
    } else {
      const uint4 v =
          ok ? __ldg(reinterpret_cast<const uint4*>(sc + 16 * sb)) : make_uint4(0, 0, 0, 0);
      hd[0] = v.x, hd[1] = v.y, hd[2] = v.z, hd[3] = v.w;
    }
  }

  // The codes of elements 4w .. 4w + 3 (a) and 16 + 4w .. 19 + 4w (b), w < 4, as bytes: the
  // levels plus kOffset (iq4: the levels, signed).
  __device__ __forceinline__ void codes(int w, uint32_t& a, uint32_t& b) const {
    if constexpr (kIq4<T>) {
      // The low half word holds elements 4w, 16 + 4w, 4w + 1, 17 + 4w; the high one the next two.
      const uint32_t x = iq4_levels(q[w]), y = iq4_levels(q[w] >> 16);
      a = __byte_perm(x, y, 0x6420), b = __byte_perm(x, y, 0x7531);
    } else if constexpr (pk.quant == 16) {
      a = q[w] & 0x0F0F0F0Fu, b = (q[w] >> 4) & 0x0F0F0F0Fu;
      if constexpr (T == DType::Q5_K) {
        a |= move_bits(h[0], w, 4) & 0x10101010u;
        b |= move_bits(h[0], w + 4, 4) & 0x10101010u;
      } else if constexpr (T == DType::Q6_K) {
        a |= move_bits(h[0], 2 * w, 4) & 0x30303030u;
        b |= move_bits(h[1], 2 * w, 4) & 0x30303030u;
      }
    } else {
      a = (q[0] >> (2 * w)) & 0x03030303u, b = (q[1] >> (2 * w)) & 0x03030303u;
      if constexpr (T == DType::Q3_K) {
        a |= move_bits(h[0], w, 2) & 0x04040404u;
        b |= move_bits(h[0], w + 4, 2) & 0x04040404u;
      }
    }
  }

  // The integer scales and mins of the sub-block's halves (one pair for both but in kHalves
  // formats) and the super-block's (iq4_nl: block's) f16 factors: value = d sc q - dmin mn.
  __device__ __forceinline__ void scales(int s, int (&sc)[2], int (&mn)[2], float& d,
                                         float& dmin) const {
    mn[0] = mn[1] = 0, dmin = 0.0f;
    if constexpr (T == DType::IQ4_NL) {
      sc[0] = sc[1] = 1, d = h2f(hd[0]);
    } else if constexpr (T == DType::IQ4_XS) {
      sc[0] = sc[1] =
          static_cast<int>(((hd[1] >> (4 * s)) & 15) | (((hd[0] >> (16 + 2 * s)) & 3) << 4)) - 32;
      d = h2f(hd[0]);
    } else if constexpr (T == DType::Q6_K) {
      sc[0] = static_cast<int8_t>(hd[0] & 0xFF), sc[1] = static_cast<int8_t>(hd[0] >> 8);
      d = h2f(hd[1]);
    } else if constexpr (T == DType::Q2_K) {
      sc[0] = hd[0] & 15, mn[0] = (hd[0] >> 4) & 15;
      sc[1] = (hd[0] >> 8) & 15, mn[1] = (hd[0] >> 12) & 15;
      d = h2f(hd[1]), dmin = h2f(hd[1] >> 16);
    } else {  // a KHead
      const uint32_t lo = ((s < 4 ? hd[0] : hd[1]) >> (8 * (s % 4))) & 0xFF;
      const uint32_t hi = (hd[2] >> (4 * s)) & 15;
      const int a = static_cast<int>((lo & 15) | ((hi & 3) << 4));
      const int b = static_cast<int>((lo >> 4) | ((hi >> 2) << 4));
      d = h2f(hd[3]);
      if constexpr (T == DType::Q3_K) {
        sc[0] = a - 32, sc[1] = b - 32;
      } else {
        sc[0] = sc[1] = a, mn[0] = mn[1] = b, dmin = h2f(hd[3] >> 16);
      }
    }
  }

  // The 32 elements as f32, as the CPU backend dequantizes them (d sc first, then its product
  // with the level, minus dmin mn).
  __device__ __forceinline__ void values(int s, float* v) const {
    int sc[2], mn[2];
    float d, dmin;
    scales(s, sc, mn, d, dmin);
    float ds[2], dm[2];
#pragma unroll
    for (int k = 0; k < 2; ++k)
      ds[k] = d * static_cast<float>(sc[k]), dm[k] = dmin * static_cast<float>(mn[k]);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      uint32_t c[2];
      codes(w, c[0], c[1]);
#pragma unroll
      for (int k = 0; k < 2; ++k)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int byte = static_cast<int>((c[k] >> (8 * i)) & 0xFF);
          const int level = kIq4<T> ? static_cast<int8_t>(byte) : byte - kOffset<T>;
          const float x = ds[k] * static_cast<float>(level);
          v[16 * k + 4 * w + i] = kMin<T> ? x - dm[k] : x;
        }
    }
  }
};

// Elements [32 sb, 32 sb + 32) of a weight row of n_sub sub-blocks, as f32.
template <DType T>
__device__ __forceinline__ void load_w(const uint8_t* row, int n_sub, int sb, float* v) {
  constexpr Packed pk = packed(T);
  if constexpr (kSubFormat<T>) {
    Sub<T> s;
    s.load(row + static_cast<size_t>(sb / 32) * pk.stride(), sb % 32, true);
    s.values(sb % 8, v);
  } else if constexpr (pk.quant != 0) {
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
