// Matrix products y[t][n_out] (+)= W x[t][n_in] (+ bias) for groups of matrices sharing x.
// Up to kMaxVecTok tokens it is a matrix-vector product that reads the weights once: for
// f16, bf16, q4_0, q4_1 and q8_0 (rows in the layout of common.cuh) each lane reads its quants
// of a 1024-element group with one or two 16-byte loads and its x values coalesced, each warp
// takes two rows that share those x values, and the quants become floats by byte permutes
// (no integer-to-float conversions);
// the jobs of a group with one weight type are one launch. The other formats use a simpler
// warp-per-row kernel. More tokens: the matrix is dequantized to f16 and multiplied by cuBLAS
// with f32 accumulation (prefill).
#include <cublas_v2.h>

#include "kvs/backend/cuda/common.cuh"
#include "kvs/backend/cuda/kernels.h"

namespace kvs::cuda {
namespace {

constexpr int kWarps = 4;  // warps per block
constexpr int kRows = 2;   // rows per warp in the fast kernel
constexpr int kMaxJobs = 3;

// The jobs of one launch; rows of job j are [first[j], first[j + 1]) of the grid's rows.
struct Group {
  const uint8_t* w[kMaxJobs];
  size_t pitch[kMaxJobs];
  float* y[kMaxJobs];
  const float* bias[kMaxJobs];
  int n_out[kMaxJobs];
  int first[kMaxJobs + 1];
  bool add[kMaxJobs];
  int n;
  int split;  // warps that share a pair of rows, each taking every split-th group
};

// Quants become floats with one byte permute each, no conversion instruction: a q4 nibble
// goes into bits 16-19 of 0.5f (giving 0.5 + q / 256), a q8 byte (+ 128) into bits 8-15 of
// 1.0f (1 + b / 32768). The affine offset is taken out per chunk of 4 elements through the
// chunk's sum of x, and the scale at the end; the f32 rounding of the offset costs at most 8
// of the 24 bits, far below the format's own error.
__device__ __forceinline__ float q4_f(uint32_t w, int k) {
  return __int_as_float(static_cast<int>(__byte_perm(w, 0x3F000000u, 0x7044u + 256 * k)));
}
__device__ __forceinline__ float q8_f(uint32_t w, int k) {
  return __int_as_float(static_cast<int>(__byte_perm(w, 0x3F800000u, 0x7604u + 16 * k)));
}

template <DType T>
constexpr bool kFast =
    T == DType::Q4_0 || T == DType::Q4_1 || T == DType::Q8_0 || T == DType::F16 || T == DType::BF16;

// A quantized element is kMul * (f - kOff) for the f that Lane::chunk() gives.
template <DType T>
constexpr float kMul = T == DType::Q8_0 ? 32768.0f : 256.0f;
template <DType T>
constexpr float kOff = T == DType::Q8_0   ? 1.00390625f
                       : T == DType::Q4_0 ? 0.53125f
                                          : 0.5f;

// What one lane holds of one row and group of 1024 elements (common.cuh's layout): the quants
// (or the raw f16/bf16 elements) and the scales of its 8 chunks of 4 elements.
template <DType T>
struct Lane {
  static constexpr bool kQ8 = T == DType::Q8_0, kHalf = T == DType::F16 || T == DType::BF16;
  static constexpr int kWords = kHalf ? 16 : kQ8 ? 8 : 4;
  uint32_t q[kWords];
  uint4 d, m;

  __device__ void load(const uint8_t* row, int gi, int lane, int n_in) {
    if constexpr (kHalf) {
      const int e0 = gi * 1024 + 4 * lane;
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        uint2 u = make_uint2(0, 0);
        if (e0 + 128 * c < n_in)
          u = __ldg(reinterpret_cast<const uint2*>(row) + (e0 + 128 * c) / 4);
        q[2 * c] = u.x, q[2 * c + 1] = u.y;
      }
    } else {
      constexpr Packed pk = packed(T);
      const uint8_t* g = row + static_cast<size_t>(gi) * pk.stride();
      const uint4* qp = reinterpret_cast<const uint4*>(g + pk.quant * lane);
#pragma unroll
      for (int k = 0; k < kWords / 4; ++k) {
        const uint4 u = __ldg(qp + k);
        q[4 * k] = u.x, q[4 * k + 1] = u.y, q[4 * k + 2] = u.z, q[4 * k + 3] = u.w;
      }
      const uint8_t* sc = g + 32 * pk.quant + 16 * (lane / 8);
      d = __ldg(reinterpret_cast<const uint4*>(sc));
      if constexpr (T == DType::Q4_1) m = __ldg(reinterpret_cast<const uint4*>(sc + 64));
    }
  }
  // The 4 elements of chunk c (for the quantized formats, as f above).
  __device__ void chunk(int c, float* e) const {
    if constexpr (kHalf) {
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const uint32_t w = q[2 * c + k];
        if constexpr (T == DType::F16) {
          const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w));
          e[2 * k] = f.x, e[2 * k + 1] = f.y;
        } else {
          e[2 * k] = __uint_as_float(w << 16), e[2 * k + 1] = __uint_as_float(w & 0xFFFF0000u);
        }
      }
    } else if constexpr (kQ8) {
      const uint32_t w = q[c] ^ 0x80808080u;  // signed bytes + 128
#pragma unroll
      for (int k = 0; k < 4; ++k) e[k] = q8_f(w, k);
    } else {
      const uint32_t w = q[c / 2], b = 2 * (c % 2);
      const uint32_t lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu;
      e[0] = q4_f(lo, b), e[1] = q4_f(hi, b), e[2] = q4_f(lo, b + 1), e[3] = q4_f(hi, b + 1);
    }
  }
  // Scales (and mins) of chunks c and c + 1.
  __device__ float2 scale2(int c) const {
    return __half22float2(reinterpret_cast<const __half2*>(&d)[c / 2]);
  }
  __device__ float2 min2(int c) const {
    return __half22float2(reinterpret_cast<const __half2*>(&m)[c / 2]);
  }
};

__device__ __forceinline__ void store(const Group& g, int j, int row, int t, float s) {
  const size_t i = static_cast<size_t>(t) * g.n_out[j] + row;
  const float v = s + (g.bias[j] ? g.bias[j][row] : 0.0f);
  g.y[j][i] = g.add[j] ? g.y[j][i] + v : v;
}

template <DType T, int NT>
__global__ void __launch_bounds__(kWarps * 32)
    matvec_fast(Group g, const float* __restrict__ x, int n_in) {
  using L = Lane<T>;
  __shared__ float red[kWarps][kRows][NT];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, split = g.split;
  const int r0 = (blockIdx.x * (kWarps / split) + warp / split) * kRows, part = warp % split;
  int j = 0;
  while (j + 1 < g.n && r0 >= g.first[j + 1]) ++j;
  if (r0 >= g.first[g.n]) return;  // with split > 1 the whole block leaves together
  const int row0 = r0 - g.first[j], n_out = g.n_out[j], n_groups = (n_in + 1023) / 1024;
  const uint8_t* rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r)  // a row past the end re-reads the last one; not stored
    rows[r] = g.w[j] + static_cast<size_t>(min(row0 + r, n_out - 1)) * g.pitch[j];
  float acc[kRows][NT] = {};
#pragma unroll 2
  for (int gi = part; gi < n_groups; gi += split) {
    L w[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) w[r].load(rows[r], gi, lane, n_in);
    const float* xg = x + gi * 1024 + 4 * lane;
    const bool full = gi * 1024 + 1024 <= n_in;
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      float4 xv[NT];
      float xs[NT];
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        xv[t] = full || gi * 1024 + 128 * c + 4 * lane < n_in
                    ? __ldg(reinterpret_cast<const float4*>(xg + static_cast<size_t>(t) * n_in +
                                                            128 * c))
                    : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        xs[t] = (xv[t].x + xv[t].y) + (xv[t].z + xv[t].w);
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float e[4];
        w[r].chunk(c, e);
        float sd = 1.0f, sm = 0.0f;
        if constexpr (!L::kHalf) {
          sd = c % 2 ? w[r].scale2(c).y : w[r].scale2(c).x;
          if constexpr (T == DType::Q4_1) sm = c % 2 ? w[r].min2(c).y : w[r].min2(c).x;
        }
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          float a = e[0] * xv[t].x;
          a = fmaf(e[1], xv[t].y, a), a = fmaf(e[2], xv[t].z, a), a = fmaf(e[3], xv[t].w, a);
          if constexpr (L::kHalf) {
            acc[r][t] += a;
          } else {
            acc[r][t] = fmaf(sd, fmaf(-kOff<T>, xs[t], a), acc[r][t]);
            if constexpr (T == DType::Q4_1)
              acc[r][t] = fmaf(sm * (1.0f / kMul<T>), xs[t], acc[r][t]);
          }
        }
      }
    }
  }
  float mul = 1.0f;
  if constexpr (!L::kHalf) mul = kMul<T>;
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = warp_sum(acc[r][t]) * mul;
  if (split == 1) {
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t)
          if (row0 + r < n_out) store(g, j, row0 + r, t, acc[r][t]);
    return;
  }
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t) red[warp][r][t] = acc[r][t];
  __syncthreads();
  if (threadIdx.x < kRows * NT) {
    const int r = threadIdx.x / NT, t = threadIdx.x % NT;
    float v = 0.0f;
    for (int w = 0; w < split; ++w) v += red[w][r][t];
    if (row0 + r < n_out) store(g, j, row0 + r, t, v);
  }
}

// Any format: a warp per row, each lane decoding whole sub-blocks.
template <DType T, int NT>
__global__ void __launch_bounds__(kWarps * 32)
    matvec_any(Group g, const float* __restrict__ x, int n_in) {
  const int r0 = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  int j = 0;
  while (j + 1 < g.n && r0 >= g.first[j + 1]) ++j;
  if (r0 >= g.first[g.n]) return;
  const int row = r0 - g.first[j];
  if (row >= g.n_out[j]) return;
  const uint8_t* r = g.w[j] + static_cast<size_t>(row) * g.pitch[j];
  float acc[NT] = {};
  const int n_sub = n_in / 32;
  for (int sb = lane; sb < n_sub; sb += 32) {
    float v[32];
    load_w<T>(r, n_sub, sb, v);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float4* xp =
          reinterpret_cast<const float4*>(x + static_cast<size_t>(t) * n_in + sb * 32);
      float s = 0.0f;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float4 xv = __ldg(xp + k);
        s = fmaf(v[4 * k], xv.x, s);
        s = fmaf(v[4 * k + 1], xv.y, s);
        s = fmaf(v[4 * k + 2], xv.z, s);
        s = fmaf(v[4 * k + 3], xv.w, s);
      }
      acc[t] += s;
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float s = warp_sum(acc[t]);
    if (lane == 0) store(g, j, row, t, s);
  }
}

template <DType T>
__global__ void dequant_f16(const uint8_t* __restrict__ w, size_t pitch, __half* __restrict__ out,
                            int n_in, int n_out) {
  const int n_sub = n_in / 32;
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<size_t>(n_sub) * n_out) return;
  const int row = static_cast<int>(i / n_sub), sb = static_cast<int>(i % n_sub);
  float v[32];
  load_w<T>(w + static_cast<size_t>(row) * pitch, n_sub, sb, v);
  uint4* o = reinterpret_cast<uint4*>(out + static_cast<size_t>(row) * n_in + sb * 32);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    uint4 u;
    __half2* h = reinterpret_cast<__half2*>(&u);
#pragma unroll
    for (int e = 0; e < 4; ++e) h[e] = __floats2half2_rn(v[8 * k + 2 * e], v[8 * k + 2 * e + 1]);
    o[k] = u;
  }
}

__global__ void to_f16(const float* __restrict__ x, __half* __restrict__ y, size_t n) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __float2half_rn(x[i]);
}

__global__ void add_bias(float* __restrict__ y, const float* __restrict__ b, int n_out, size_t n) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] += b[i % n_out];
}

const char* cublas_error(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "architecture mismatch";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "execution failed";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "not supported";
    default:
      return "error";
  }
}

// One launch for jobs [0, n) of one weight type.
void matvec(Ctx& c, const float* x, int64_t n_tok, const MatJob* jobs, int n) {
  const DType type = jobs[0].w->type;
  const int n_in = static_cast<int>(jobs[0].w->n_in);
  dispatch(type, [&]<DType T>() {
    constexpr int kPer = kFast<T> ? kRows : 1;  // rows per warp
    Group g{};
    g.n = n;
    for (int j = 0; j < n; ++j) {
      const Matrix& w = *jobs[j].w;
      g.w[j] = w.data, g.pitch[j] = w.row_bytes, g.y[j] = jobs[j].y, g.bias[j] = jobs[j].bias;
      g.n_out[j] = static_cast<int>(w.n_out), g.add[j] = jobs[j].add;
      g.first[j + 1] = g.first[j] + (g.n_out[j] + kPer - 1) / kPer * kPer;
    }
    // Rows of 4096 or more elements: the 4 warps of a block share a pair of rows (more blocks
    // in flight for the 4096-row matrices); shorter rows: a pair per warp.
    g.split = kFast<T> && n_in >= 4096 ? kWarps : 1;
    const int per_block = kWarps / g.split;
    const unsigned grid = static_cast<unsigned>((g.first[n] / kPer + per_block - 1) / per_block);
    switch (n_tok) {
#define KVS_NT(N)                                                        \
  case N:                                                                \
    if constexpr (kFast<T>)                                              \
      matvec_fast<T, N><<<grid, kWarps * 32, 0, c.stream>>>(g, x, n_in); \
    else                                                                 \
      matvec_any<T, N><<<grid, kWarps * 32, 0, c.stream>>>(g, x, n_in);  \
    break;
      KVS_NT(1) KVS_NT(2) KVS_NT(3) KVS_NT(4) KVS_NT(5) KVS_NT(6) KVS_NT(7) KVS_NT(8)
#undef KVS_NT
    }
  });
  KVS_CUDA_CHECK(cudaGetLastError());
}

void gemm(Ctx& c, const float* x, int64_t n_tok, const MatJob& job) {
  const Matrix& w = *job.w;
  const int n_in = static_cast<int>(w.n_in), n_out = static_cast<int>(w.n_out);
  __half* wh = c.scratch_w(static_cast<size_t>(n_in) * n_out);
  __half* xh = c.scratch_x(static_cast<size_t>(n_in) * n_tok);
  const size_t n_sub = static_cast<size_t>(n_in / 32) * n_out;
  dispatch(w.type, [&]<DType T>() {
    dequant_f16<T><<<(n_sub + 255) / 256, 256, 0, c.stream>>>(w.data, w.row_bytes, wh, n_in, n_out);
  });
  const size_t nx = static_cast<size_t>(n_in) * n_tok;
  to_f16<<<(nx + 255) / 256, 256, 0, c.stream>>>(x, xh, nx);
  KVS_CUDA_CHECK(cudaGetLastError());
  const float one = 1.0f, beta = job.add ? 1.0f : 0.0f;
  const cublasStatus_t st =
      cublasGemmEx(c.cublas, CUBLAS_OP_T, CUBLAS_OP_N, n_out, static_cast<int>(n_tok), n_in, &one,
                   wh, CUDA_R_16F, n_in, xh, CUDA_R_16F, n_in, &beta, job.y, CUDA_R_32F, n_out,
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS)
    fail("cuBLAS: cublasGemmEx (", n_out, " x ", n_tok, " x ", n_in,
         ") failed: ", cublas_error(st));
  if (job.bias) {
    const size_t n = static_cast<size_t>(n_out) * n_tok;
    add_bias<<<(n + 255) / 256, 256, 0, c.stream>>>(job.y, job.bias, n_out, n);
    KVS_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace

void matmuls(Ctx& c, const float* x, int64_t n_tok, const MatJob* jobs, int n_jobs) {
  for (int i = 0; i < n_jobs; ++i) {
    const Matrix& w = *jobs[i].w;
    KVS_CHECK(w.n_in % 32 == 0, "cuda: matrix rows of ", w.n_in,
              " elements (need a multiple of 32)");
    KVS_CHECK(w.n_in == jobs[0].w->n_in, "cuda: the matrices of one group differ in width");
  }
  if (n_tok > kMaxVecTok) {
    for (int i = 0; i < n_jobs; ++i) gemm(c, x, n_tok, jobs[i]);
    return;
  }
  // Runs of jobs with one weight type share a launch.
  for (int i = 0; i < n_jobs;) {
    int n = 1;
    while (i + n < n_jobs && n < kMaxJobs && jobs[i + n].w->type == jobs[i].w->type) ++n;
    matvec(c, x, n_tok, jobs + i, n);
    i += n;
  }
}

}  // namespace kvs::cuda
