// Times the Gated DeltaNet kernels (delta_net.cuh) at Qwen3.5 27B's shape: 16 key heads, 48
// value heads of 128, 4 conv taps. Built with the CUDA backend as kvs_gdn_bench; run it on the
// GPU machine:  kvs_gdn_bench [HBM_GB/S]  (default 3350, an H100 SXM)
//   decode: one token through the conv, the token-by-token delta rule and the gated norm, over
//     48 layers' states (more than L2 holds) in turn; GB/s counts the state read and written
//     (2 x 48 x 128 x 128 x 4 bytes a layer), the layer's time all three launches.
//   prefill: sequences of 512, 2048 and 8192 tokens through the chunk kernels (64 tokens a
//     chunk: intra_k, every chunk's record at once, then slices_k, the chunks in order, a block
//     per kSlice value rows of a head), each timed and both together, and with the conv and the
//     norm a whole layer; TFLOP/s counts the chunk's products once per head (K K^T and Q K^T
//     lower halves, K M^T, Q M^T, U^T K, T R and Lq U: the WY form's products with T R whole):
//     2 (2 n^2 S + 3 n S^2) a chunk of n; and up to 2048 tokens token by token (the path of
//     cards whose shared memory holds no chunk).
// Each figure is the mean of 50 launches back to back after 5 untimed, PDL on (PDL=0: off).
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kvs/backend/cuda/delta_net.cuh"

using namespace kvs;
using namespace kvs::cuda;

namespace {

constexpr int kKHeads = 16, kVHeads = 48, kHead = 128, kTaps = 4, kLayers = 48;
constexpr int kConvDim = (2 * kKHeads + kVHeads) * kHead;

// Microseconds a run of go(i), over 50 runs back to back after 5 untimed.
template <class F>
double time_us(cudaStream_t s, F go) {
  for (int i = 0; i < 5; ++i) go(i);
  cudaEvent_t a, b;
  KVS_CUDA_CHECK(cudaEventCreate(&a));
  KVS_CUDA_CHECK(cudaEventCreate(&b));
  const int n = 50;
  KVS_CUDA_CHECK(cudaEventRecord(a, s));
  for (int i = 0; i < n; ++i) go(i);
  KVS_CUDA_CHECK(cudaEventRecord(b, s));
  KVS_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  KVS_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  KVS_CUDA_CHECK(cudaEventDestroy(a));
  KVS_CUDA_CHECK(cudaEventDestroy(b));
  return ms * 1000.0 / n;
}

float* device_floats(size_t n, float lo, float hi, unsigned seed) {
  std::vector<float> h(n);
  srand(seed);
  for (float& x : h) x = lo + (hi - lo) * static_cast<float>(rand()) / static_cast<float>(RAND_MAX);
  float* d = nullptr;
  KVS_CUDA_CHECK(cudaMalloc(&d, n * sizeof(float)));
  KVS_CUDA_CHECK(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  const double hbm = argc > 1 ? atof(argv[1]) : 3350.0;
  pdl_enabled() = getenv("PDL") ? atoi(getenv("PDL")) : 1;
  Ctx c;
  KVS_CUDA_CHECK(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
  cudaDeviceProp prop{};
  KVS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  c.smem_optin = prop.sharedMemPerBlockOptin;
  const int max_tok = 8192;
  const size_t state_floats = static_cast<size_t>(kVHeads) * kHead * kHead;
  const size_t tail_floats = static_cast<size_t>(kTaps - 1) * kConvDim;
  float* qkv = device_floats(static_cast<size_t>(max_tok) * kConvDim, -2.0f, 2.0f, 1);
  float* z = device_floats(static_cast<size_t>(max_tok) * kVHeads * kHead, -2.0f, 2.0f, 2);
  float* alpha = device_floats(static_cast<size_t>(max_tok) * kVHeads, -2.0f, 2.0f, 3);
  float* beta = device_floats(static_cast<size_t>(max_tok) * kVHeads, -3.0f, 3.0f, 4);
  float* conv_w = device_floats(static_cast<size_t>(kConvDim) * kTaps, -0.5f, 0.5f, 5);
  float* dt_bias = device_floats(kVHeads, -3.0f, 0.0f, 6);
  float* a = device_floats(kVHeads, -2.0f, -0.1f, 7);
  float* norm = device_floats(kHead, 0.8f, 1.2f, 8);
  float* states = device_floats(kLayers * (state_floats + tail_floats), -0.01f, 0.01f, 9);
  float *conv = nullptr, *y = nullptr;
  KVS_CUDA_CHECK(cudaMalloc(&conv, delta_net_scratch(max_tok, kConvDim, kVHeads)));
  float* prep = conv + static_cast<size_t>(max_tok) * kConvDim;
  KVS_CUDA_CHECK(cudaMalloc(&y, static_cast<size_t>(max_tok) * kVHeads * kHead * sizeof(float)));
  const auto layer = [&](int i) {
    return states + static_cast<size_t>(i % kLayers) * (state_floats + tail_floats);
  };
  const auto gdn = [&](int i, int n_tok, int chunk) {
    return Gdn{conv, alpha, beta,    dt_bias, a,     y,    layer(i) + tail_floats,
               prep, n_tok, kKHeads, kVHeads, chunk, 1e-6f};
  };
  // The conv rows of every token once, for the prefill's runs (decode writes the first row).
  launch(conv_k<kTaps>, dim3((kConvDim + 127) / 128, (max_tok + kConvTok - 1) / kConvTok), 128, 0,
         c.stream, qkv, layer(0), conv_w, conv, max_tok, kConvDim);
  const dim3 tok_grid(kVHeads, kHead / (kTokRows * kTokWarps));
  using I = IntraSmem<kHead>;
  using V = SliceSmem<kHead>;
  const dim3 slice_grid(kHead / kSlice, kVHeads);
  allow_smem(intra_k<kHead>, I::bytes);
  allow_smem(slices_k<kHead>, V::bytes);
  std::printf("Gated DeltaNet at Qwen3.5 27B's shape (%d key, %d value heads of %d, %d taps)\n",
              kKHeads, kVHeads, kHead, kTaps);

  const double state_bytes = 2.0 * static_cast<double>(state_floats) * sizeof(float);
  const double rec_us = time_us(c.stream, [&](int i) {
    launch(tokens_k<kHead>, tok_grid, 32 * kTokWarps, 0, c.stream, gdn(i, 1, 1));
  });
  const double layer_us = time_us(c.stream, [&](int i) {
    launch(conv_k<kTaps>, (kConvDim + 127) / 128, 128, 0, c.stream, qkv, layer(i), conv_w, conv, 1,
           kConvDim);
    launch(tokens_k<kHead>, tok_grid, 32 * kTokWarps, 0, c.stream, gdn(i, 1, 1));
    launch(norm_k<kHead>, (kVHeads + 3) / 4, 128, 0, c.stream, y, z, norm, kVHeads, 1e-6f);
  });
  std::printf("decode   delta rule %7.2f us  %6.0f GB/s  %5.1f%% of %.0f GB/s\n", rec_us,
              state_bytes / rec_us / 1e3, 100.0 * state_bytes / rec_us / 1e3 / hbm, hbm);
  std::printf("decode   layer (conv, delta rule, norm) %7.2f us; %d layers %7.1f us a token\n",
              layer_us, kLayers, layer_us * kLayers);

  for (int n_tok : {512, 2048, 8192}) {
    const double n = kChunk, S = kHead;
    const double flops =
        2.0 * (2.0 * n * n * S + 3.0 * n * S * S) * kVHeads * ((n_tok + kChunk - 1) / kChunk);
    const dim3 intra_grid((n_tok + kChunk - 1) / kChunk, kVHeads);
    const auto chunks = [&](int i) {
      launch(intra_k<kHead>, intra_grid, kChunkThreads, I::bytes, c.stream, gdn(i, n_tok, kChunk));
      launch(slices_k<kHead>, slice_grid, kChunkThreads, V::bytes, c.stream,
             gdn(i, n_tok, kChunk));
    };
    const double intra_us = time_us(c.stream, [&](int i) {
      launch(intra_k<kHead>, intra_grid, kChunkThreads, I::bytes, c.stream, gdn(i, n_tok, kChunk));
    });
    const double slices_us = time_us(c.stream, [&](int i) {
      launch(slices_k<kHead>, slice_grid, kChunkThreads, V::bytes, c.stream,
             gdn(i, n_tok, kChunk));
    });
    const double chunk_us = time_us(c.stream, chunks);
    const double token_us =
        n_tok > 2048 ? 0.0 : time_us(c.stream, [&](int i) {
          launch(tokens_k<kHead>, tok_grid, 32 * kTokWarps, 0, c.stream, gdn(i, n_tok, 1));
        });
    const dim3 conv_grid((kConvDim + 127) / 128, (n_tok + kConvTok - 1) / kConvTok);
    const double conv_us = time_us(c.stream, [&](int i) {
      launch(conv_k<kTaps>, conv_grid, 128, 0, c.stream, qkv, layer(i), conv_w, conv, n_tok,
             kConvDim);
    });
    const int rows = n_tok * kVHeads;
    const double norm_us = time_us(c.stream, [&](int) {
      launch(norm_k<kHead>, (rows + 3) / 4, 128, 0, c.stream, y, z, norm, rows, 1e-6f);
    });
    std::printf(
        "prefill  %4d tokens: delta rule in chunks %8.1f us (intra %.1f, slices %.1f) %6.1f "
        "TFLOP/s; token by token %8.1f us\n",
        n_tok, chunk_us, intra_us, slices_us, flops / chunk_us / 1e6, token_us);
    std::printf("prefill  %4d tokens: layer %8.1f us (conv %.1f, norm %.1f)\n", n_tok,
                conv_us + chunk_us + norm_us, conv_us, norm_us);
  }
  KVS_CUDA_CHECK(cudaDeviceSynchronize());
  return 0;
}
