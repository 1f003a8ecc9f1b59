// Times the integer matrix-vector kernel's variants (rows per warp, groups per chunk, one
// chunk ahead or not, warps per row) on the matrix shapes of the 8B models (--shapes 27b: of
// Qwen3.5 27B), one token: the numbers behind q_shape() in matmul.cu, then the variant q_shape()
// picks ("chosen"). Built with the CUDA backend as kvs_matvec_sweep; run it on the GPU machine:
//   kvs_matvec_sweep [--shapes 8b|27b] [--hbm GB/S] [FORMAT...]
// (default iq4_xs q4_0 q4_k q3_k; PDL=0: without programmatic dependent launch). Each variant
// runs 100 times over copies of the matrices larger than the L2 cache; the times include the
// launches, back to back. GB/s counts the bytes of the rows in the device layout (layout.h), %
// of --hbm (default 3350, an H100 SXM). The chosen variants' times over a decode step's matrices
// ("TOKEN") end each format. TRIAL: iq4 formats are timed in each way of their table look-up
// (way=W; 0: the kernel before it), each checked bit for bit against way 0 on random rows.
#include "../src/kvs/backend/cuda/matmul.cu"

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

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
            int way, double us, double bytes) {
  printf("%-6s %-8s %sR=%d U=%d pipe=%d split=%d way=%d  %7.2f us  %6.0f GB/s  %5.1f %%\n", tn,
         sh.name, what, r, u, p, split, way, us, bytes / us / 1e3, bytes / us / 1e3 / g_hbm * 100);
}

template <DType T, int R, int U, bool P, int W>
void run_variant(Ctx& c, const char* tn, const Shape& sh, std::vector<std::vector<Matrix>>& ws,
                 float* y, const XBlock* xq, const XMeta* xm, double bytes) {
  const int n = static_cast<int>(sh.outs.size());
  for (int split : {1, 2}) {
    const double us = time_us(c, [&](int i) {
      MatJob jobs[3];
      jobs_of(sh, ws, y, i, jobs);
      launch_q<T, 1, R, U, P, W>(c, jobs, n, split, xq, xm, sh.n_in);
    });
    report(tn, sh, "", R, U, P, split, W, us, bytes);
  }
}

// q_shape()'s variant in way W at NT tokens.
template <DType T, int NT, int W>
void launch_shape(Ctx& c, const MatJob* jobs, int n, const QShape& q, const XBlock* xq,
                  const XMeta* xm, int n_in) {
  if constexpr (eight_rows(packed(T).lane_bytes(), kSubFormat<T>, NT)) {
    if (q.r == 8)
      return q.pipe ? launch_q<T, NT, 8, 1, true, W>(c, jobs, n, q.split, xq, xm, n_in)
                    : launch_q<T, NT, 8, 2, false, W>(c, jobs, n, q.split, xq, xm, n_in);
  }
  if (q.pipe)
    launch_q<T, NT, 4, 1, true, W>(c, jobs, n, q.split, xq, xm, n_in);
  else
    launch_q<T, NT, 4, 2, false, W>(c, jobs, n, q.split, xq, xm, n_in);
}

QShape shape_of(DType t, const Shape& sh, int n_tok) {
  int rows = 0;
  for (int o : sh.outs) rows += o;
  const Packed pk = packed(t);
  return q_shape(rows, sh.n_in, n_tok, pk.lane_bytes(), k_quant(t) || t == DType::IQ4_NL);
}

// What the matmuls of a decode step run: q_shape()'s variant (in way W).
template <DType T, int W>
double run_chosen(Ctx& c, const char* tn, const Shape& sh, std::vector<std::vector<Matrix>>& ws,
                  float* y, const XBlock* xq, const XMeta* xm, double bytes) {
  const int n = static_cast<int>(sh.outs.size());
  const QShape q = shape_of(T, sh, 1);
  const double us = time_us(c, [&](int i) {
    MatJob jobs[3];
    jobs_of(sh, ws, y, i, jobs);
    launch_shape<T, 1, W>(c, jobs, n, q, xq, xm, sh.n_in);
  });
  report(tn, sh, "chosen ", q.r, q.u, q.pipe, q.split, W, us, bytes);
  return us;
}

// Way W's outputs at NT tokens on copy 0 of the matrices (random rows), as floats.
template <DType T, int NT, int W>
std::vector<float> outputs(Ctx& c, const Shape& sh, std::vector<std::vector<Matrix>>& ws, float* y,
                           const XBlock* xq, const XMeta* xm) {
  const int n = static_cast<int>(sh.outs.size());
  MatJob jobs[3];
  jobs_of(sh, ws, y, 0, jobs);
  KVS_CUDA_CHECK(cudaMemset(y, 0, 3 * 300000 * sizeof(float)));
  launch_shape<T, NT, W>(c, jobs, n, shape_of(T, sh, NT), xq, xm, sh.n_in);
  std::vector<float> h(3 * 300000);
  KVS_CUDA_CHECK(cudaStreamSynchronize(c.stream));
  KVS_CUDA_CHECK(cudaMemcpy(h.data(), y, h.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}

// Rows of random quants and scales for type T, f16 factors kept finite.
void fill_random(DType t, uint8_t* dev, size_t row_bytes, int rows, int n_groups, uint32_t seed) {
  const Packed pk = packed(t);
  std::vector<uint8_t> h(row_bytes * rows);
  std::mt19937 rng(seed);
  for (auto& b : h) b = static_cast<uint8_t>(rng());
  for (int r = 0; r < rows; ++r)
    for (int g = 0; g < n_groups; ++g) {
      uint8_t* sc =
          h.data() + r * row_bytes + static_cast<size_t>(g) * pk.stride() + 32 * pk.lane_bytes();
      // iq4_xs: a d per super-block of 8 bytes; iq4_nl: a d per block of 2 bytes.
      const int n = t == DType::IQ4_XS ? 4 : 32, step = t == DType::IQ4_XS ? 8 : 2;
      for (int k = 0; k < n; ++k) {
        const uint16_t d = static_cast<uint16_t>(0x1800 + rng() % 0x1000);  // 2^-9 .. 2^-7
        memcpy(sc + k * step, &d, 2);
      }
    }
  KVS_CUDA_CHECK(cudaMemcpy(dev, h.data(), h.size(), cudaMemcpyHostToDevice));
}

template <DType T, int NT, int W>
void check_way(Ctx& c, const char* tn, const Shape& sh, std::vector<std::vector<Matrix>>& ws,
               float* y, const XBlock* xq, const XMeta* xm, const std::vector<float>& ref) {
  const std::vector<float> got = outputs<T, NT, W>(c, sh, ws, y, xq, xm);
  size_t differ = 0, n = 0;
  for (size_t j = 0; j < sh.outs.size(); ++j)
    for (size_t i = 0; i < static_cast<size_t>(sh.outs[j]) * NT; ++i, ++n)
      differ += memcmp(&got[j * 300000 + i], &ref[j * 300000 + i], 4) != 0;
  printf("%-6s %-8s check way=%d tokens=%d: %zu of %zu outputs differ from way 0%s\n", tn, sh.name,
         W, NT, differ, n, differ ? "  MISMATCH" : "");
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
  KVS_CUDA_CHECK(cudaMalloc(&xbuf, xq_bytes(17408, 8)));
  float* x;
  KVS_CUDA_CHECK(cudaMalloc(&x, 17408 * 8 * sizeof(float)));
  std::vector<float> hx(17408 * 8);
  for (size_t i = 0; i < hx.size(); ++i) hx[i] = std::sin(i * 0.37f) * (1.0f + (i % 7));
  cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice);
  auto sweep = [&]<DType T>() {
    const char* tn = dtype_name(T);
    constexpr Packed pk = packed(T);
    double chosen_us[6] = {}, token_bytes = 0;
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
      XMeta* xm = reinterpret_cast<XMeta*>(xbuf + nbx * 8 * sizeof(XBlock));
      launch(quantize_x, (nbx * 8 + 7) / 8, 256, 0, c.stream, x, xq, xm, nbx * 8);
      const double bytes = static_cast<double>(per);
      token_bytes += bytes * sh.per_token;
      auto variants = [&]<int W>() {
        if constexpr (packed(T).lane_bytes() <= 16) {  // 8 rows of more bytes would spill
          run_variant<T, 8, 2, false, W>(c, tn, sh, ws, y, xq, xm, bytes);
          run_variant<T, 8, 1, true, W>(c, tn, sh, ws, y, xq, xm, bytes);
        }
        run_variant<T, 4, 2, false, W>(c, tn, sh, ws, y, xq, xm, bytes);
        run_variant<T, 4, 1, true, W>(c, tn, sh, ws, y, xq, xm, bytes);
        run_variant<T, 4, 4, false, W>(c, tn, sh, ws, y, xq, xm, bytes);
        run_variant<T, 2, 2, false, W>(c, tn, sh, ws, y, xq, xm, bytes);
        const double us = run_chosen<T, W>(c, tn, sh, ws, y, xq, xm, bytes);
        chosen_us[W] += us * sh.per_token;
      };
      if constexpr (kIq4<T>) {
        variants.template operator()<0>();
        variants.template operator()<1>();
        variants.template operator()<2>();
        variants.template operator()<3>();
        variants.template operator()<4>();
        variants.template operator()<5>();
        // Every way against way 0, bit for bit, on random rows at 1 and 2 tokens.
        for (size_t j = 0; j < sh.outs.size(); ++j)
          fill_random(T, static_cast<uint8_t*>(raw[j]), rb, sh.outs[j], n_groups,
                      17 + static_cast<uint32_t>(j));
        const std::vector<float> ref1 = outputs<T, 1, 0>(c, sh, ws, y, xq, xm);
        check_way<T, 1, 1>(c, tn, sh, ws, y, xq, xm, ref1);
        check_way<T, 1, 2>(c, tn, sh, ws, y, xq, xm, ref1);
        check_way<T, 1, 3>(c, tn, sh, ws, y, xq, xm, ref1);
        check_way<T, 1, 4>(c, tn, sh, ws, y, xq, xm, ref1);
        check_way<T, 1, 5>(c, tn, sh, ws, y, xq, xm, ref1);
        const std::vector<float> ref2 = outputs<T, 2, 0>(c, sh, ws, y, xq, xm);
        check_way<T, 2, 3>(c, tn, sh, ws, y, xq, xm, ref2);
        check_way<T, 2, 5>(c, tn, sh, ws, y, xq, xm, ref2);
      } else {
        variants.template operator()<kIq4Way>();
      }
      for (void* p : raw) cudaFree(p);
      fflush(stdout);
    }
    for (int w = 0; w < 6; ++w)
      if (chosen_us[w] > 0)
        printf(
            "%-6s TOKEN    way=%d chosen variants over a decode step's matrices: %8.1f us  "
            "%6.0f GB/s  %5.1f %%\n",
            tn, w, chosen_us[w], token_bytes / chosen_us[w] / 1e3,
            token_bytes / chosen_us[w] / 1e3 / g_hbm * 100);
    fflush(stdout);
  };
  if (formats.empty()) formats = {DType::IQ4_XS, DType::Q4_0, DType::Q4_K, DType::Q3_K};
  for (DType t : formats) switch (t) {  // TRIAL: these formats only, to build in time
      case DType::IQ4_XS:
        sweep.template operator()<DType::IQ4_XS>();
        break;
      case DType::Q4_0:
        sweep.template operator()<DType::Q4_0>();
        break;
      case DType::Q4_K:
        sweep.template operator()<DType::Q4_K>();
        break;
      case DType::Q3_K:
        sweep.template operator()<DType::Q3_K>();
        break;
      default:
        fail("kvs_matvec_sweep: ", dtype_name(t), " is not swept in this build");
    }
  return 0;
}
