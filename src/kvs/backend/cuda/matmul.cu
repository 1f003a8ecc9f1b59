// Matrix products y[t][n_out] = W x[t][n_in] (+ bias). Up to kMaxVecTok tokens: a warp per
// weight row decodes each 32-element sub-block once and dots it with every token (decode reads
// the weights once). More tokens: the matrix is dequantized to f16 and multiplied by cuBLAS
// with f32 accumulation (prefill).
#include <cublas_v2.h>

#include "kvs/backend/cuda/common.cuh"
#include "kvs/backend/cuda/kernels.h"

namespace kvs::cuda {
namespace {

constexpr int kWarps = 4;  // rows per block

template <DType T, int NT>
__global__ void __launch_bounds__(kWarps * 32)
    matvec(const uint8_t* __restrict__ w, size_t row_bytes, const float* __restrict__ x,
           float* __restrict__ y, int n_in, int n_out, const float* __restrict__ bias) {
  const int row = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= n_out) return;
  const uint8_t* r = w + static_cast<size_t>(row) * row_bytes;
  float acc[NT] = {};
  const int n_sub = n_in / 32;
  for (int sb = lane; sb < n_sub; sb += 32) {
    float v[32];
    load_sub<T>(r, sb, v);
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
    if (lane == 0) y[static_cast<size_t>(t) * n_out + row] = s + (bias ? bias[row] : 0.0f);
  }
}

template <DType T>
__global__ void dequant_f16(const uint8_t* __restrict__ w, size_t row_bytes, __half* __restrict__ out,
                            int n_in, int n_out) {
  const int n_sub = n_in / 32;
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<size_t>(n_sub) * n_out) return;
  const int row = static_cast<int>(i / n_sub), sb = static_cast<int>(i % n_sub);
  float v[32];
  load_sub<T>(w + static_cast<size_t>(row) * row_bytes, sb, v);
  __half2* o = reinterpret_cast<__half2*>(out + static_cast<size_t>(row) * n_in + sb * 32);
#pragma unroll
  for (int j = 0; j < 16; ++j) o[j] = __floats2half2_rn(v[2 * j], v[2 * j + 1]);
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

}  // namespace

void matmul(Ctx& c, const Matrix& w, const float* x, float* y, int64_t n_tok, const float* bias) {
  KVS_CHECK(w.n_in % 32 == 0, "cuda: matrix rows of ", w.n_in, " elements (need a multiple of 32)");
  const int n_in = static_cast<int>(w.n_in), n_out = static_cast<int>(w.n_out);
  if (n_tok <= kMaxVecTok) {
    const dim3 grid((n_out + kWarps - 1) / kWarps);
    dispatch(w.type, [&]<DType T>() {
      switch (n_tok) {
#define KVS_NT(N)                                                                         \
  case N:                                                                                 \
    matvec<T, N><<<grid, kWarps * 32, 0, c.stream>>>(w.data, w.row_bytes, x, y, n_in, n_out, \
                                                      bias);                              \
    break;
        KVS_NT(1) KVS_NT(2) KVS_NT(3) KVS_NT(4) KVS_NT(5) KVS_NT(6) KVS_NT(7) KVS_NT(8)
#undef KVS_NT
      }
    });
    KVS_CUDA_CHECK(cudaGetLastError());
    return;
  }
  __half* wh = c.scratch_w(static_cast<size_t>(n_in) * n_out);
  __half* xh = c.scratch_x(static_cast<size_t>(n_in) * n_tok);
  const size_t n_sub = static_cast<size_t>(n_in / 32) * n_out;
  dispatch(w.type, [&]<DType T>() {
    dequant_f16<T><<<(n_sub + 255) / 256, 256, 0, c.stream>>>(w.data, w.row_bytes, wh, n_in, n_out);
  });
  const size_t nx = static_cast<size_t>(n_in) * n_tok;
  to_f16<<<(nx + 255) / 256, 256, 0, c.stream>>>(x, xh, nx);
  KVS_CUDA_CHECK(cudaGetLastError());
  const float one = 1.0f, zero = 0.0f;
  const cublasStatus_t st = cublasGemmEx(
      c.cublas, CUBLAS_OP_T, CUBLAS_OP_N, n_out, static_cast<int>(n_tok), n_in, &one, wh,
      CUDA_R_16F, n_in, xh, CUDA_R_16F, n_in, &zero, y, CUDA_R_32F, n_out, CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS)
    fail("cuBLAS: cublasGemmEx (", n_out, " x ", n_tok, " x ", n_in, ") failed: ", cublas_error(st));
  if (bias) {
    const size_t n = static_cast<size_t>(n_out) * n_tok;
    add_bias<<<(n + 255) / 256, 256, 0, c.stream>>>(y, bias, n_out, n);
    KVS_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace kvs::cuda
