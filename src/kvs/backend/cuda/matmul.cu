// Matrix products y[t][n_out] (+)= W x[t][n_in] (+ bias) for groups of matrices sharing x.
// Up to kMaxVecTok tokens it is a matrix-vector product that reads the weights once: for
// f16, bf16, q4_0, q4_1 and q8_0 (rows in the packed layout of common.cuh) each lane takes
// whole 32-element blocks with 16-byte loads, each warp two rows that share the x values it
// loads, and the quants become floats by byte permutes (no integer-to-float conversions);
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
};

// 2^23 + byte k of w as a float: the byte lands in the low mantissa bits.
__device__ __forceinline__ float byte_f(uint32_t w, int k) {
  return __int_as_float(static_cast<int>(__byte_perm(w, 0x4B000000u, 0x7440u + k)));
}

// Per-format decoding of one 32-element block for the fast kernel: load() reads the quants
// (kWords 32-bit words) and scale; deq(i) gives elements 4i..4i+3 (lo) and 16+4i..16+4i+3 (hi).
template <DType T>
struct Fast;

template <>
struct Fast<DType::Q4_0> {
  static constexpr int kWords = 4;
  static constexpr bool kScale = true, kMin = false;
  __device__ static void load(const uint8_t* r, int n_sub, int b, uint32_t* q, float& d, float&) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(r) + b);
    q[0] = u.x, q[1] = u.y, q[2] = u.z, q[3] = u.w;
    d = h2f(r + n_sub * 16 + 2 * b);
  }
  __device__ static void deq(const uint32_t* q, int i, float* lo, float* hi) {
    const uint32_t l = q[i] & 0x0F0F0F0Fu, h = (q[i] >> 4) & 0x0F0F0F0Fu;
#pragma unroll
    for (int k = 0; k < 4; ++k) lo[k] = byte_f(l, k) - 8388616.0f, hi[k] = byte_f(h, k) - 8388616.0f;
  }
};

template <>
struct Fast<DType::Q4_1> {
  static constexpr int kWords = 4;
  static constexpr bool kScale = true, kMin = true;
  __device__ static void load(const uint8_t* r, int n_sub, int b, uint32_t* q, float& d, float& m) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(r) + b);
    q[0] = u.x, q[1] = u.y, q[2] = u.z, q[3] = u.w;
    d = h2f(r + n_sub * 16 + 4 * b);
    m = h2f(r + n_sub * 16 + 4 * b + 2);
  }
  __device__ static void deq(const uint32_t* q, int i, float* lo, float* hi) {
    const uint32_t l = q[i] & 0x0F0F0F0Fu, h = (q[i] >> 4) & 0x0F0F0F0Fu;
#pragma unroll
    for (int k = 0; k < 4; ++k) lo[k] = byte_f(l, k) - 8388608.0f, hi[k] = byte_f(h, k) - 8388608.0f;
  }
};

template <>
struct Fast<DType::Q8_0> {
  static constexpr int kWords = 8;
  static constexpr bool kScale = true, kMin = false;
  __device__ static void load(const uint8_t* r, int n_sub, int b, uint32_t* q, float& d, float&) {
    const uint4* p = reinterpret_cast<const uint4*>(r) + 2 * b;
    const uint4 u = __ldg(p), v = __ldg(p + 1);
    q[0] = u.x, q[1] = u.y, q[2] = u.z, q[3] = u.w, q[4] = v.x, q[5] = v.y, q[6] = v.z, q[7] = v.w;
    d = h2f(r + n_sub * 32 + 2 * b);
  }
  // Signed bytes: flipping the sign bit gives byte + 128.
  __device__ static void deq(const uint32_t* q, int i, float* lo, float* hi) {
    const uint32_t l = q[i] ^ 0x80808080u, h = q[i + 4] ^ 0x80808080u;
#pragma unroll
    for (int k = 0; k < 4; ++k) lo[k] = byte_f(l, k) - 8388736.0f, hi[k] = byte_f(h, k) - 8388736.0f;
  }
};

template <>
struct Fast<DType::F16> {
  static constexpr int kWords = 16;
  static constexpr bool kScale = false, kMin = false;
  __device__ static void load(const uint8_t* r, int, int b, uint32_t* q, float&, float&) {
    const uint4* p = reinterpret_cast<const uint4*>(r) + 4 * b;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint4 u = __ldg(p + k);
      q[4 * k] = u.x, q[4 * k + 1] = u.y, q[4 * k + 2] = u.z, q[4 * k + 3] = u.w;
    }
  }
  __device__ static void deq(const uint32_t* q, int i, float* lo, float* hi) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&q[2 * i + k]));
      const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&q[8 + 2 * i + k]));
      lo[2 * k] = a.x, lo[2 * k + 1] = a.y, hi[2 * k] = b.x, hi[2 * k + 1] = b.y;
    }
  }
};

template <>
struct Fast<DType::BF16> {
  static constexpr int kWords = 16;
  static constexpr bool kScale = false, kMin = false;
  __device__ static void load(const uint8_t* r, int n_sub, int b, uint32_t* q, float& d, float& m) {
    Fast<DType::F16>::load(r, n_sub, b, q, d, m);
  }
  __device__ static void deq(const uint32_t* q, int i, float* lo, float* hi) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const uint32_t a = q[2 * i + k], b = q[8 + 2 * i + k];
      lo[2 * k] = __uint_as_float(a << 16), lo[2 * k + 1] = __uint_as_float(a & 0xFFFF0000u);
      hi[2 * k] = __uint_as_float(b << 16), hi[2 * k + 1] = __uint_as_float(b & 0xFFFF0000u);
    }
  }
};

template <DType T>
constexpr bool kFast = T == DType::Q4_0 || T == DType::Q4_1 || T == DType::Q8_0 ||
                       T == DType::F16 || T == DType::BF16;

__device__ __forceinline__ void store(const Group& g, int j, int row, int t, float s) {
  const size_t i = static_cast<size_t>(t) * g.n_out[j] + row;
  const float v = s + (g.bias[j] ? g.bias[j][row] : 0.0f);
  g.y[j][i] = g.add[j] ? g.y[j][i] + v : v;
}

template <DType T, int NT>
__global__ void __launch_bounds__(kWarps * 32)
    matvec_fast(Group g, const float* __restrict__ x, int n_in) {
  using F = Fast<T>;
  const int lane = threadIdx.x % 32;
  const int r0 = (blockIdx.x * kWarps + threadIdx.x / 32) * kRows;
  int j = 0;
  while (j + 1 < g.n && r0 >= g.first[j + 1]) ++j;
  if (r0 >= g.first[g.n]) return;
  const int row0 = r0 - g.first[j], n_out = g.n_out[j], n_sub = n_in / 32;
  const uint8_t* rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r)  // a row past the end re-reads the last one; not stored
    rows[r] = g.w[j] + static_cast<size_t>(min(row0 + r, n_out - 1)) * g.pitch[j];
  float acc[kRows][NT] = {};
#pragma unroll 2
  for (int b = lane; b < n_sub; b += 32) {
    uint32_t q[kRows][F::kWords];
    float d[kRows] = {}, m[kRows] = {};
#pragma unroll
    for (int r = 0; r < kRows; ++r) F::load(rows[r], n_sub, b, q[r], d[r], m[r]);
    float s[kRows][NT] = {}, xs[NT] = {};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float4 xl[NT], xh[NT];
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float* xp = x + static_cast<size_t>(t) * n_in + b * 32 + 4 * i;
        xl[t] = __ldg(reinterpret_cast<const float4*>(xp));
        xh[t] = __ldg(reinterpret_cast<const float4*>(xp + 16));
        if constexpr (F::kMin) xs[t] += (xl[t].x + xl[t].y) + (xl[t].z + xl[t].w) + (xh[t].x + xh[t].y) + (xh[t].z + xh[t].w);
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float lo[4], hi[4];
        F::deq(q[r], i, lo, hi);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          float a = s[r][t];
          a = fmaf(lo[0], xl[t].x, a), a = fmaf(lo[1], xl[t].y, a);
          a = fmaf(lo[2], xl[t].z, a), a = fmaf(lo[3], xl[t].w, a);
          a = fmaf(hi[0], xh[t].x, a), a = fmaf(hi[1], xh[t].y, a);
          a = fmaf(hi[2], xh[t].z, a), a = fmaf(hi[3], xh[t].w, a);
          s[r][t] = a;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if constexpr (F::kScale) acc[r][t] = fmaf(d[r], s[r][t], acc[r][t]);
        else acc[r][t] += s[r][t];
        if constexpr (F::kMin) acc[r][t] = fmaf(m[r], xs[t], acc[r][t]);
      }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float v = warp_sum(acc[r][t]);
      if (lane == 0 && row0 + r < n_out) store(g, j, row0 + r, t, v);
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
      const float4* xp = reinterpret_cast<const float4*>(x + static_cast<size_t>(t) * n_in + sb * 32);
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
    case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    default: return "error";
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
    const unsigned grid = static_cast<unsigned>((g.first[n] / kPer + kWarps - 1) / kWarps);
    switch (n_tok) {
#define KVS_NT(N)                                                                        \
  case N:                                                                                \
    if constexpr (kFast<T>)                                                              \
      matvec_fast<T, N><<<grid, kWarps * 32, 0, c.stream>>>(g, x, n_in);                 \
    else                                                                                 \
      matvec_any<T, N><<<grid, kWarps * 32, 0, c.stream>>>(g, x, n_in);                  \
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
  const cublasStatus_t st = cublasGemmEx(
      c.cublas, CUBLAS_OP_T, CUBLAS_OP_N, n_out, static_cast<int>(n_tok), n_in, &one, wh,
      CUDA_R_16F, n_in, xh, CUDA_R_16F, n_in, &beta, job.y, CUDA_R_32F, n_out, CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS)
    fail("cuBLAS: cublasGemmEx (", n_out, " x ", n_tok, " x ", n_in, ") failed: ", cublas_error(st));
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
    KVS_CHECK(w.n_in % 32 == 0, "cuda: matrix rows of ", w.n_in, " elements (need a multiple of 32)");
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
