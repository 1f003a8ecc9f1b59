// Times the integer matrix-vector kernel's variants (rows per warp, groups per chunk, one
// chunk ahead or not, warps per row) on the matrix shapes of the 8B models (--shapes 27b: of
// Qwen3.5 27B), one token: the numbers behind q_shape() in matvec.cuh, then the variant q_shape()
// picks ("chosen"). Built with the CUDA backend as kvs_matvec_sweep; run it on the GPU machine:
//   kvs_matvec_sweep [--shapes 8b|27b] [--hbm GB/S] [FORMAT...]
// (default: every format of the integer kernel; PDL=0: without programmatic dependent launch).
// Each variant runs 100 times over copies of the matrices larger than the L2 cache; the times
// include the launches, back to back. GB/s counts the bytes of the rows in the device layout
// (layout.h), % of --hbm (default 3350, an H100 SXM). Each format ends with its chosen
// variants over the matrices of a decode step ("step": each matrix as often as a token runs it).
#include <cstdio>
#include <string>
#include <vector>

#include "kvs/backend/cuda/matvec.cuh"

using namespace kvs;
using namespace kvs::cuda;

struct Shape {
  const char* name;
  int n_in;
  std::vector<int> outs;
  int per_token;  // launches of it in a decode step of the model
};

// Microseconds a launch, over 100 launches back to back after 10 untimed; go(i) launches on
// the i-th copy of the matrices.
template <class F>
double time_us(Ctx& c, F go) {
  for (int i = 0; i < 10; ++i) go(i);
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  const int n = 100;
  cudaEventRecord(a, c.stream);
  for (int i = 0; i < n; ++i) go(i);
  cudaEventRecord(b, c.stream);
  KVS_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a), cudaEventDestroy(b);
  return ms * 1000.0 / n;
}

// The jobs of a shape on copy i of its matrices.
void jobs_of(const Shape& sh, std::vector<std::vector<Matrix>>& ws, float* y, int i,
             MatJob (&jobs)[3]) {
  for (size_t j = 0; j < sh.outs.size(); ++j)
    jobs[j] = MatJob{&ws[i % ws.size()][j], y + j * 300000, nullptr, false};
}

double g_hbm = 3350.0;

void report(const char* tn, const Shape& sh, const char* what, int r, int u, bool p, int split,
            double us, double bytes) {
  printf("%-6s %-8s %sR=%d U=%d pipe=%d split=%d  %7.2f us  %6.0f GB/s  %5.1f %%\n", tn, sh.name,
         what, r, u, p, split, us, bytes / us / 1e3, bytes / us / 1e3 / g_hbm * 100);
}

template <DType T, int R, int U, bool P>
void run_variant(Ctx& c, const char* tn, const Shape& sh, std::vector<std::vector<Matrix>>& ws,
                 float* y, const XBlock* xq, const XMeta* xm, double bytes) {
  const int n = static_cast<int>(sh.outs.size());
  for (int split : {1, 2, 4}) {
    const double us = time_us(c, [&](int i) {
      MatJob jobs[3];
      jobs_of(sh, ws, y, i, jobs);
      launch_q<T, 1, R, U, P>(c, jobs, n, split, xq, xm, sh.n_in);
    });
    report(tn, sh, "", R, U, P, split, us, bytes);
  }
}

// What the matmuls of a decode step run: q_shape()'s variant; its time.
template <DType T>
double run_chosen(Ctx& c, const char* tn, const Shape& sh, std::vector<std::vector<Matrix>>& ws,
                  float* y, const XBlock* xq, const XMeta* xm, double bytes) {
  const int n = static_cast<int>(sh.outs.size());
  int rows = 0;
  for (int o : sh.outs) rows += o;
  const QShape q = q_shape(rows, sh.n_in, 1, packed(T).lane_bytes(), kSubFormat<T>, kIq4<T>);
  const double us = time_us(c, [&](int i) {
    MatJob jobs[3];
    jobs_of(sh, ws, y, i, jobs);
    matvec(c, nullptr, 1, jobs, n, xq, xm);
  });
  report(tn, sh, "chosen ", q.r, q.u, q.pipe, q.split, us, bytes);
  return us;
}

int main(int argc, char** argv) {
  pdl_enabled() = getenv("PDL") ? atoi(getenv("PDL")) : 1;
  Ctx c;
  KVS_CUDA_CHECK(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
  KVS_CUDA_CHECK(cudaDeviceGetAttribute(&c.n_sm, cudaDevAttrMultiProcessorCount, 0));
  bool qwen = false;
  std::vector<DType> formats;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--hbm" && i + 1 < argc)
      g_hbm = atof(argv[++i]);
    else if (a == "--shapes" && i + 1 < argc)
      qwen = std::string(argv[++i]) == "27b";
    else
      formats.push_back(parse_dtype(a, "format"));
  }
  // Qwen3.5 27B: 48 Gated DeltaNet layers (in-projections qkv, z, alpha [, beta apart]; out),
  // 16 attention ones (q with its gate, k, v; o), 64 FFNs.
  std::vector<Shape> shapes = {
      {"gdn_in", 5120, {10240, 6144, 48}, 48}, {"gdn_out", 6144, {5120}, 48},
      {"qkv", 5120, {12288, 1024, 1024}, 16},  {"wo", 6144, {5120}, 16},
      {"gateup", 5120, {17408, 17408}, 64},    {"down", 17408, {5120}, 64}};
  if (!qwen)
    shapes = {{"qkv", 4096, {4096, 1024, 1024}, 32}, {"wo", 4096, {4096}, 32},
              {"gateup", 4096, {14336, 14336}, 32},  {"down", 14336, {4096}, 32},
              {"q3gu", 4096, {12288, 12288}, 0},     {"q3down", 12288, {4096}, 0},
              {"output", 4096, {128256}, 1}};
  float* y;
  KVS_CUDA_CHECK(cudaMalloc(&y, 3 * 300000 * sizeof(float)));
  uint8_t* xbuf;
  KVS_CUDA_CHECK(cudaMalloc(&xbuf, xq_bytes(17408, 1)));
  float* x;
  KVS_CUDA_CHECK(cudaMalloc(&x, 17408 * sizeof(float)));
  std::vector<float> hx(17408);
  for (size_t i = 0; i < hx.size(); ++i) hx[i] = std::sin(i * 0.37f);
  cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice);
  auto sweep = [&]<DType T>() {
    const char* tn = dtype_name(T);
    constexpr Packed pk = packed(T);
    double chosen_us = 0, step_bytes = 0;
    for (const Shape& sh : shapes) {
      const int n_groups = (sh.n_in / 32 + 31) / 32;
      const size_t rb = static_cast<size_t>(n_groups) * pk.stride();
      size_t per = 0;
      for (int o : sh.outs) per += rb * o;
      const int copies = std::max<int>(2, static_cast<int>((600ull << 20) / per));
      std::vector<std::vector<Matrix>> ws(copies);
      std::vector<void*> raw;
      for (int i = 0; i < copies; ++i)
        for (int o : sh.outs) {
          void* p;
          KVS_CUDA_CHECK(cudaMalloc(&p, rb * o));
          cudaMemset(p, 0x11, rb * o);
          raw.push_back(p);
          Matrix m;
          m.type = T, m.n_in = sh.n_in, m.n_out = o, m.row_bytes = rb;
          m.data = static_cast<uint8_t*>(p);
          ws[i].push_back(m);
        }
      XBlock* xq = reinterpret_cast<XBlock*>(xbuf);
      const int nbx = sh.n_in / 32;
      XMeta* xm = reinterpret_cast<XMeta*>(xbuf + nbx * sizeof(XBlock));
      launch(quantize_x, (nbx + 7) / 8, 256, 0, c.stream, x, xq, xm, nbx);
      const double bytes = static_cast<double>(per);
      step_bytes += bytes * sh.per_token;
      run_variant<T, 2, 2, false>(c, tn, sh, ws, y, xq, xm, bytes);
      run_variant<T, 4, 2, false>(c, tn, sh, ws, y, xq, xm, bytes);
      run_variant<T, 1, 2, false>(c, tn, sh, ws, y, xq, xm, bytes);
      run_variant<T, 2, 4, false>(c, tn, sh, ws, y, xq, xm, bytes);
      run_variant<T, 4, 4, false>(c, tn, sh, ws, y, xq, xm, bytes);
      run_variant<T, 2, 1, true>(c, tn, sh, ws, y, xq, xm, bytes);
      run_variant<T, 4, 1, true>(c, tn, sh, ws, y, xq, xm, bytes);
      if constexpr (packed(T).lane_bytes() <= 16) {  // 8 rows of more bytes would spill
        run_variant<T, 8, 2, false>(c, tn, sh, ws, y, xq, xm, bytes);
        run_variant<T, 8, 1, true>(c, tn, sh, ws, y, xq, xm, bytes);
      }
      chosen_us += run_chosen<T>(c, tn, sh, ws, y, xq, xm, bytes) * sh.per_token;
      for (void* p : raw) cudaFree(p);
      fflush(stdout);
    }
    const double gbs = step_bytes / chosen_us / 1e3;
    printf("%-6s step     chosen, over a decode step's matrices  %9.1f us  %6.0f GB/s  %5.1f %%\n",
           tn, chosen_us, gbs, gbs / g_hbm * 100);
    fflush(stdout);
  };
  if (formats.empty())
    formats = {DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::IQ4_NL, DType::IQ4_XS,
               DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q3_K,   DType::Q2_K};
  for (DType t : formats)
    dispatch(t, [&]<DType T>() {
      if constexpr (kQuant<T>)
        sweep.template operator()<T>();
      else
        fail("kvs_matvec_sweep: ", dtype_name(T), " is not a format of the integer kernel");
    });
  return 0;
}
