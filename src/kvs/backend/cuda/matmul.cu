// Matrix products y[t][n_out] (+)= W x[t][n_in] (+ bias) for groups of matrices sharing x.
// Up to kMaxSliceTok tokens it is a matrix-vector product that reads the weights once per
// kMaxVecTok of them:
// - q4_0, q4_1, q8_0, the k-quants, iq4_xs and iq4_nl (rows in the layout of layout.h): x is
//   first quantized per 32-element block to two int8 planes, x = dx (h + l / 254) (relative
//   error below 2e-5 of the block's largest value, about f32's rounding of the old float
//   kernel), and lane l of a warp takes sub-block l of each 1024-element group of R rows at
//   once (R and the loads in flight: q_shape): one 8- to 32-byte load of quants per row (and
//   of the bits above them), integer dot products with __dp4a, the sub-block's scales applied
//   once (per half of 16 for q6_k, q3_k, q2_k, in integers). A few instructions per 4 weights
//   (iq4: two byte permutes, one per half of its table, each dotted with x), so the loads set
//   the speed.
// - f16, bf16: lanes read 4 elements per 128, x coalesced, two rows per warp, f32 products.
// - the other formats (f32, q5_0, q5_1): a simpler warp-per-row kernel.
// The jobs of a group with one weight type are one launch. More tokens: the matrix is
// dequantized to f16 and multiplied by cuBLAS with f32 accumulation (prefill).
#include <cublas_v2.h>

#include "kvs/backend/cuda/matvec.cuh"

namespace kvs::cuda {
namespace {

template <DType T>
__global__ void dequant_f16(const uint8_t* __restrict__ w, size_t pitch, __half* __restrict__ out,
                            int n_in, int n_out) {
  pdl_wait();
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
  pdl_wait();
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __float2half_rn(x[i]);
}

__global__ void add_bias(float* __restrict__ y, const float* __restrict__ b, int n_out, size_t n) {
  pdl_wait();
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

void gemm(Ctx& c, const float* x, int64_t n_tok, const MatJob& job) {
  const Matrix& w = *job.w;
  const int n_in = static_cast<int>(w.n_in), n_out = static_cast<int>(w.n_out);
  __half* wh = c.scratch_w(static_cast<size_t>(n_in) * n_out);
  __half* xh = c.scratch_x(static_cast<size_t>(n_in) * n_tok);
  const size_t n_sub = static_cast<size_t>(n_in / 32) * n_out;
  dispatch(w.type, [&]<DType T>() {
    launch(dequant_f16<T>, (n_sub + 255) / 256, 256, 0, c.stream, w.data, w.row_bytes, wh, n_in,
           n_out);
  });
  const size_t nx = static_cast<size_t>(n_in) * n_tok;
  launch(to_f16, (nx + 255) / 256, 256, 0, c.stream, x, xh, nx);
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
    launch(add_bias, (n + 255) / 256, 256, 0, c.stream, job.y, job.bias, n_out, n);
  }
}

}  // namespace

size_t xq_bytes(int64_t n_in, int64_t n_tok) {
  return static_cast<size_t>(n_tok * n_in / 32) * (sizeof(XBlock) + sizeof(XMeta));
}

void matmuls(Ctx& c, const float* x, int64_t n_tok, const MatJob* jobs, int n_jobs,
             const uint8_t* x_quantized) {
  for (int i = 0; i < n_jobs; ++i) {
    const Matrix& w = *jobs[i].w;
    KVS_CHECK(w.n_in % 32 == 0, "cuda: matrix rows of ", w.n_in,
              " elements (need a multiple of 32)");
    KVS_CHECK(w.n_in == jobs[0].w->n_in, "cuda: the matrices of one group differ in width");
  }
  if (n_tok > kMaxSliceTok) {
    for (int i = 0; i < n_jobs; ++i) gemm(c, x, n_tok, jobs[i]);
    return;
  }
  // x quantized once for the integer kernel, if any job needs it and its producer has not.
  const int n_blocks = static_cast<int>(n_tok * jobs[0].w->n_in / 32);
  const XBlock* xq = nullptr;
  const XMeta* xm = nullptr;
  for (int i = 0; i < n_jobs && !xq; ++i)
    dispatch(jobs[i].w->type, [&]<DType T>() {
      if constexpr (kQuant<T>) {
        const uint8_t* buf = x_quantized;
        if (!buf) {
          uint8_t* b = c.scratch_xq(xq_bytes(jobs[0].w->n_in, n_tok));
          launch(quantize_x, (n_blocks + 7) / 8, 256, 0, c.stream, x, reinterpret_cast<XBlock*>(b),
                 reinterpret_cast<XMeta*>(b + static_cast<size_t>(n_blocks) * sizeof(XBlock)),
                 n_blocks);
          buf = b;
        }
        xq = reinterpret_cast<const XBlock*>(buf);
        xm = reinterpret_cast<const XMeta*>(buf + static_cast<size_t>(n_blocks) * sizeof(XBlock));
      }
    });
  // Runs of jobs with one weight type share a launch; the last asks for the next product.
  // More than kMaxVecTok tokens go in slices, each a matrix-vector product of its own.
  const L2Next next = c.next;
  const int64_t n_in = jobs[0].w->n_in, per_tok = n_in / 32;
  for (int i = 0; i < n_jobs;) {
    int n = 1;
    while (i + n < n_jobs && n < kMaxJobs && jobs[i + n].w->type == jobs[i].w->type) ++n;
    c.next = i + n == n_jobs ? next : L2Next{};
    for (int64_t t0 = 0; t0 < n_tok; t0 += kMaxVecTok) {
      MatJob slice[kMaxJobs];
      for (int k = 0; k < n; ++k) {
        slice[k] = jobs[i + k];
        slice[k].y += t0 * slice[k].w->n_out;
      }
      const size_t b0 = static_cast<size_t>(t0 * per_tok);
      matvec(c, x + t0 * n_in, std::min<int64_t>(kMaxVecTok, n_tok - t0), slice, n,
             xq ? xq + b0 : nullptr, xm ? xm + b0 : nullptr);
    }
    i += n;
  }
  c.next = {};
}

#ifdef KVS_TRACE
KVS_TRACE_BIND(trace_bind_matmul)
#endif

}  // namespace kvs::cuda
