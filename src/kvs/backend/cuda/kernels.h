// Host-side launchers of the CUDA kernels, grouped by operation (matmul.cu, ops.cu,
// attention*.cu). All run on the context's compute stream; pointers are device memory.
#pragma once

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <functional>

#include "kvs/backend/cuda/backend.h"
#include "kvs/backend/device.h"

namespace kvs::cuda {

constexpr int kMaxVecTok = 8;  // tokens of one matrix-vector product kernel
// Up to this many tokens a step is batch-invariant: every token's bits are those of a step of
// it alone (products in matrix-vector slices of kMaxVecTok, attention token by token, norms
// per row), as a speculative verify step's rows must be. Beyond, the prefill kernels.
constexpr int kMaxSliceTok = kCudaInvariantTokens;
// Prefill attention on a quantized cache converts it to f16 in chunks of at most half this
// much, the next chunk converting while the last is attended to (reserved with the other
// scratch buffers; a larger page takes its own size).
constexpr size_t kKv16Bytes = size_t{128} << 20;
constexpr int kMaxSpans16 = 4096;

// Weights of the next matrix-vector product that the current one asks L2 to fetch, so that
// the memory works while the small kernels between the two run: up to 4 byte ranges in the
// order the next product reads them, as 128-byte lines.
struct L2Next {
  const uint8_t* p[4] = {};
  uint32_t lines[4] = {};
  int n = 0;
  // Only the blocks from this one ask (the product's last wave: what earlier waves asked for
  // would leave L2 again under the later waves' weights). Set by the launch.
  int from_block = 0;
};

// What the kernels share: the stream, cuBLAS, and scratch buffers that grow on demand.
struct Ctx {
  Device* dev = nullptr;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  // A second stream for work that overlaps the compute stream's (the f16 conversion of the next
  // chunk of a prefill's cache), with its events: side_ready (the compute stream's work so
  // far), converted[b] and consumed[b] (scratch half b written, and read).
  cudaStream_t side = nullptr;
  cudaEvent_t side_ready = nullptr, converted[2] = {}, consumed[2] = {};
  DeviceBuffer w16, x16, part, xq, kv16, spans16, flags, gdn;
  int n_sm = 0;  // the GPU's multiprocessors
  size_t smem_optin = 0;  // the most shared memory a block may have
  // Forces decode_by_warp's answer (CudaOptions::decode_split).
  CudaOptions::DecodeSplit decode_split = CudaOptions::DecodeSplit::Auto;
  L2Next next;  // for the next matmuls call's last launch (set by the device)
  // While the operations of a recorded step run, whose staged inputs were copied before its
  // first kernel: a warp per span may then issue its first copies before its wait.
  bool staged = false;

  // While a step is being recorded as a graph, a scratch buffer that must grow first runs and
  // waits for what was recorded so far (pause: the old buffer may be in use), then recording
  // goes on (resume).
  std::function<void()> pause, resume;
  // The prefill's scratch in memory the engine lends (Device::lend_prefill_scratch): each part
  // is used instead of the buffer of its name while it is large enough.
  struct Lent {
    uint8_t* p = nullptr;
    size_t n = 0;
  };
  Lent lent_w16, lent_x16, lent_kv16, lent_spans16, lent_gdn;
  uint8_t* scratch(DeviceBuffer& own, const Lent& lent, size_t bytes, const char* what) {
    return lent.p && bytes <= lent.n ? lent.p : grow(own, bytes, what).as();
  }
  __half* scratch_w(size_t n) {
    return reinterpret_cast<__half*>(
        scratch(w16, lent_w16, n * sizeof(__half), "f16 weight tiles"));
  }
  __half* scratch_x(size_t n) {
    return reinterpret_cast<__half*>(scratch(x16, lent_x16, n * sizeof(__half), "f16 activations"));
  }
  float* scratch_part(size_t n) {
    return grow(part, n * sizeof(float), "attention partials").as<float>();
  }
  // A Gated DeltaNet layer's conv output and its chunks' products, n floats.
  float* scratch_gdn(size_t n) {
    return reinterpret_cast<float*>(
        scratch(gdn, lent_gdn, n * sizeof(float), "Gated DeltaNet rows"));
  }
  uint8_t* scratch_xq(size_t bytes) { return grow(xq, bytes, "quantized activations").as(); }
  // Zeroed whenever it grows (the decode fold's flags and launch numbers start over).
  unsigned* scratch_flags(size_t n) {
    return grow(flags, n * sizeof(unsigned), "attention flags", true).as<unsigned>();
  }
  __half* scratch_kv16(size_t bytes) {
    return reinterpret_cast<__half*>(scratch(kv16, lent_kv16, bytes, "f16 K/V chunks"));
  }
  Span* scratch_spans16(size_t n) {
    return reinterpret_cast<Span*>(
        scratch(spans16, lent_spans16, n * sizeof(Span), "f16 K/V chunk spans"));
  }
  // A buffer too small is replaced by one of grown(bytes).
  DeviceBuffer& grow(DeviceBuffer& b, size_t bytes, const char* what, bool zero = false);
  static constexpr size_t grown(size_t bytes) { return bytes + bytes / 4; }
};

// Copies n bytes (a multiple of 16, both addresses 16-byte aligned) from host memory to dst
// through kernel parameters, in order on `stream`, without the copy engine.
void stage_bytes(cudaStream_t stream, uint8_t* dst, const uint8_t* src, size_t n);
// Bytes of x quantized for the integer matrix-vector kernel (n_tok rows of n_in).
size_t xq_bytes(int64_t n_in, int64_t n_tok);
// Jobs' matrices are in the device layout of place_weights; biases are device pointers.
// x_quantized: x already quantized for the integer kernel (xq_bytes), by rmsnorm or swiglu.
void matmuls(Ctx& c, const float* x, int64_t n_tok, const MatJob* jobs, int n_jobs,
             const uint8_t* x_quantized = nullptr);
void embed(Ctx& c, const Matrix& emb, const int32_t* ids, int32_t n, float* x);
// xq: where to write y quantized for the integer matrix-vector kernel too (n a multiple of 32).
void rmsnorm(Ctx& c, const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps,
             uint8_t* xq = nullptr);
// inv[i] = base^(-2i / rope_dim), computed on the host in double as the CPU backend does.
void rope(Ctx& c, float* q, float* k, const int32_t* pos, int32_t n_tok, int32_t n_head,
          int32_t n_head_kv, const RopeParams& p, const double* inv);
// rope, then kv_write of the rotated k and v, in one launch; with norm.q (device weights, heads
// of 64 or 128) the q and k heads normalized in place first, as rmsnorm does.
void rope_kv_write(Ctx& c, float* q, float* k, const float* v, const int32_t* pos, int32_t n_tok,
                   int32_t n_head, const RopeParams& p, const double* inv, const KvLayout& l,
                   uint8_t* const* pages, const int32_t* slots, const QkNorm& norm = {});
void swiglu(Ctx& c, float* gate, const float* up, int64_t n, uint8_t* xq = nullptr);
void geglu(Ctx& c, float* gate, const float* up, int64_t n, uint8_t* xq = nullptr);
void scale(Ctx& c, float* x, float s, int64_t n);
void sigmoid_mul(Ctx& c, float* x, const float* gate, int64_t n);
void add(Ctx& c, float* x, const float* y, int64_t n);
void kv_write(Ctx& c, const KvLayout& l, const float* k, const float* v, int32_t n_tok,
              uint8_t* const* pages, const int32_t* slots);
// How the decode attention of a sequence that sees n_ctx keys splits its work: false, a block
// per (span, kv head), its warps' quarters of the span merged; true, a warp per (span, kv head)
// (on tensor cores; heads on CUDA cores take either alike). Decided by the whole context, never
// by the spans of one call, so a streamed run (the ring's chunks) and a resident one (all spans
// at once) take the same path.
bool decode_by_warp(const Ctx& c, const KvLayout& l, int64_t n_ctx);
// a.spans and a.pos point to device copies. xq: a decode's last call also writes its output
// quantized there (as rmsnorm does). by_warp: decode_by_warp's answer for the sequence.
void attention(Ctx& c, const AttentionArgs& a, uint8_t* xq = nullptr, bool by_warp = false);
// Device::fold: a.n_spans spans' partials at part (pinned host memory, the decode's rows)
// fetched into the partials' scratch and folded into a's state by the decode's fold.
void fold_partials(Ctx& c, const AttentionArgs& a, const float* part, uint8_t* xq = nullptr);
// Whether gated_delta_net has kernels for value heads of `head` and a conv of `taps`.
bool delta_net_shape(int64_t head, int64_t taps);
// Whether a prefill's delta rule (chunk > 1) runs a chunk at a time on this GPU (heads of `head`):
// where a block's shared memory cannot hold a chunk it runs token by token (equal within rounding).
bool delta_net_chunked(const Ctx& c, int32_t head);
// Bytes of scratch_gdn a prefill's call of n_tok tokens needs (the conv's rows, and in chunks of
// 64 the chunks' state-independent products).
size_t delta_net_scratch(int64_t n_tok, int64_t conv_dim, int64_t v_heads);
// Pointers are device memory; the conv's output and the chunks' products go to scratch_gdn.
void gated_delta_net(Ctx& c, const DeltaNetArgs& a);

}  // namespace kvs::cuda
