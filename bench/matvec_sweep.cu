// Times the integer matrix-vector kernel's variants (rows per warp, groups per chunk, one
// chunk ahead or not, warps per row) on the matrix shapes of the 8B models, q4_0 and q8_0:
// the numbers behind q_shape() in matmul.cu (bench/results/h200-matvec-sweep.txt). Built with
// the CUDA backend as kvs_matvec_sweep; run it on the GPU machine (PDL=0: without programmatic
// dependent launch). Each variant runs 100 times over copies of the matrices larger than the
// L2 cache; the times include the launches, back to back.
// `kvs_matvec_sweep trial`: the staged kernel (KVS_MATVEC=staged) checked bit for bit against
// matvec_q with one warp a row set (random rows of q4_0, q4_1 and q8_0; sizes that are not
// multiples of the rows a set, a half group at the rows' end, several sets a warp, rings of 2
// and 3 stages so every slot is refilled many times), then timed against matmuls' own choice
// and in its variants (blocks an SM, stages, rows a set). Exit status 1 on a mismatch.
#include "../src/kvs/backend/cuda/matmul.cu"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using namespace kvs;
using namespace kvs::cuda;

struct Shape {
  const char* name;
  int n_in;
  std::vector<int> outs;
};

// Mean time of f over 100 runs after 10, in microseconds (f(i): the i-th run).
template <class F>
double time_us(Ctx& c, F&& f) {
  for (int i = 0; i < 10; ++i) f(i);
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  const int n = 100;
  cudaEventRecord(a, c.stream);
  for (int i = 0; i < n; ++i) f(i);
  cudaEventRecord(b, c.stream);
  KVS_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a), cudaEventDestroy(b);
  return ms * 1000.0 / n;
}

template <DType T, int R, int U, bool P>
void run_variant(Ctx& c, const char* tn, const Shape& sh, std::vector<std::vector<Matrix>>& ws,
                 float* y, const XBlock* xq, const XMeta* xm, double bytes) {
  for (int split : {1, 2, 4}) {
    auto go = [&](int i) {
      MatJob jobs[3];
      for (size_t j = 0; j < sh.outs.size(); ++j) {
        jobs[j] = MatJob{&ws[i % ws.size()][j], y + j * 200000, nullptr, false};
      }
      launch_q<T, 1, R, U, P>(c, jobs, static_cast<int>(sh.outs.size()), split, xq, xm, sh.n_in);
    };
    const double us = time_us(c, go);
    printf("%-6s %-8s R=%d U=%d pipe=%d split=%d  %7.2f us  %6.0f GB/s\n", tn, sh.name, R, U, P,
           split, us, bytes / us / 1e3);
  }
}

// Random rows in the device layout (common.cuh): quants of hashed bytes, scales and mins small
// f16 values, the blocks past the row's end zero.
__device__ uint32_t mix(uint32_t x) {
  x ^= x >> 16, x *= 0x7feb352du, x ^= x >> 15, x *= 0x846ca68bu, x ^= x >> 16;
  return x;
}
template <DType T>
__global__ void fill_rows(uint8_t* w, size_t pitch, int n_in, int rows, uint32_t seed) {
  constexpr Packed pk = packed(T);
  const int n_blocks = n_in / 32, n_groups = (n_blocks + 31) / 32;
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<size_t>(rows) * n_groups * 32) return;
  const int l = static_cast<int>(i % 32), gi = static_cast<int>(i / 32 % n_groups);
  const size_t row = i / 32 / n_groups;
  uint8_t* grp = w + row * pitch + static_cast<size_t>(gi) * pk.stride();
  const bool live = gi * 32 + l < n_blocks;
  for (int k = 0; k < pk.quant; ++k)
    grp[pk.quant * l + k] =
        live ? static_cast<uint8_t>(mix(seed ^ static_cast<uint32_t>(i * 64 + k))) : 0;
  __half* sc = reinterpret_cast<__half*>(grp + 32 * pk.quant) + l;
  const uint32_t h = mix(seed * 3 + static_cast<uint32_t>(i));
  sc[0] = __float2half(live ? (static_cast<int>(h % 2001) - 1000) * 1e-5f : 0.0f);
  if (T == DType::Q4_1)
    sc[32] = __float2half(live ? (static_cast<int>((h >> 11) % 2001) - 1000) * 1e-4f : 0.0f);
}

struct Rows {
  Rows() = default;
  Rows(const Rows&) = delete;
  Rows& operator=(const Rows&) = delete;
  std::vector<Matrix> m;
  std::vector<void*> raw;
  ~Rows() {
    for (void* p : raw) cudaFree(p);
  }
};
template <DType T>
void make_rows(Rows& r, int n_in, const std::vector<int>& outs, uint32_t seed) {
  constexpr Packed pk = packed(T);
  const size_t rb = static_cast<size_t>((n_in / 32 + 31) / 32) * pk.stride();
  for (int o : outs) {
    void* p;
    KVS_CUDA_CHECK(cudaMalloc(&p, rb * o));
    r.raw.push_back(p);
    const size_t n = static_cast<size_t>(o) * (rb / pk.stride()) * 32;
    fill_rows<T><<<(n + 255) / 256, 256>>>(static_cast<uint8_t*>(p), rb, n_in, o, seed++);
    Matrix m;
    m.type = T, m.n_in = n_in, m.n_out = o, m.row_bytes = rb;
    m.data = static_cast<uint8_t*>(p);
    r.m.push_back(m);
  }
  KVS_CUDA_CHECK(cudaDeviceSynchronize());
}

// x of n_in random values, quantized (xq_bytes(n_in, 1) at buf).
void make_x(Ctx& c, int n_in, uint8_t* buf, uint32_t seed) {
  std::vector<float> hx(n_in);
  for (int i = 0; i < n_in; ++i) hx[i] = std::sin(i * 0.37f + seed) * (1.0f + (i % 7));
  float* x;
  KVS_CUDA_CHECK(cudaMalloc(&x, n_in * sizeof(float)));
  KVS_CUDA_CHECK(cudaMemcpy(x, hx.data(), n_in * sizeof(float), cudaMemcpyHostToDevice));
  const int nb = n_in / 32;
  launch(quantize_x, (nb + 7) / 8, 256, 0, c.stream, x, reinterpret_cast<XBlock*>(buf),
         reinterpret_cast<XMeta*>(buf + nb * sizeof(XBlock)), nb);
  KVS_CUDA_CHECK(cudaStreamSynchronize(c.stream));
  cudaFree(x);
}

// The outputs of jobs over `rows` after f ran; outputs start as `init` (the second job adds).
template <class F>
std::vector<uint32_t> outputs(Ctx& c, Rows& rows, float* y, const std::vector<float>& init, F&& f) {
  KVS_CUDA_CHECK(cudaMemcpy(y, init.data(), init.size() * 4, cudaMemcpyHostToDevice));
  std::vector<MatJob> jobs;
  size_t off = 0;
  for (size_t j = 0; j < rows.m.size(); ++j) {
    jobs.push_back(MatJob{&rows.m[j], y + off, nullptr, j == 1});
    off += rows.m[j].n_out;
  }
  f(jobs.data(), static_cast<int>(jobs.size()));
  KVS_CUDA_CHECK(cudaStreamSynchronize(c.stream));
  std::vector<uint32_t> out(off);
  KVS_CUDA_CHECK(cudaMemcpy(out.data(), y, off * 4, cudaMemcpyDeviceToHost));
  return out;
}

template <DType T>
int check(Ctx& c, const char* tn, float* y, uint8_t* xbuf) {
  struct Case {
    int n_in;
    std::vector<int> outs;
  };
  const Case cases[] = {{4096, {5003, 2517}}, {14336, {4096}}, {4608, {1000, 37}}, {1024, {9}}};
  int bad = 0;
  uint32_t seed = 1;
  for (const Case& cs : cases) {
    Rows rows;
    make_rows<T>(rows, cs.n_in, cs.outs, seed += 10);
    make_x(c, cs.n_in, xbuf, seed);
    const XBlock* xq = reinterpret_cast<const XBlock*>(xbuf);
    const XMeta* xm = reinterpret_cast<const XMeta*>(xbuf + cs.n_in / 32 * sizeof(XBlock));
    size_t n_out = 0;
    for (int o : cs.outs) n_out += o;
    std::vector<float> init(n_out);
    for (size_t i = 0; i < n_out; ++i) init[i] = std::cos(i * 0.11f);
    for (int r : {2, 4}) {
      const std::vector<uint32_t> want = outputs(c, rows, y, init, [&](const MatJob* j, int n) {
        if (r == 2)
          launch_q<T, 1, 2, 1, false>(c, j, n, 1, xq, xm, cs.n_in);
        else
          launch_q<T, 1, 4, 1, false>(c, j, n, 1, xq, xm, cs.n_in);
      });
      for (int per_sm : {1, 2})
        for (int stages : {2, 3}) {
          const std::vector<uint32_t> got = outputs(c, rows, y, init, [&](const MatJob* j, int n) {
            launch_staged<T>(c, j, n, xq, xm, cs.n_in, StShape{r, per_sm, stages});
          });
          size_t diff = 0;
          for (size_t i = 0; i < want.size(); ++i) diff += want[i] != got[i];
          printf("check %-5s n_in %5d rows %5zu R=%d per_sm=%d stages=%d: %s", tn, cs.n_in, n_out,
                 r, per_sm, stages, diff ? "MISMATCH" : "same bits");
          if (diff) printf(" (%zu of %zu outputs differ)", diff, want.size());
          printf("\n");
          bad += diff != 0;
        }
    }
  }
  fflush(stdout);
  return bad;
}

template <DType T>
void trial_times(Ctx& c, const char* tn, const std::vector<Shape>& shapes, float* y,
                 uint8_t* xbuf) {
  constexpr Packed pk = packed(T);
  for (const Shape& sh : shapes) {
    const size_t rb = static_cast<size_t>((sh.n_in / 32 + 31) / 32) * pk.stride();
    size_t per = 0;
    for (int o : sh.outs) per += rb * o;
    const int copies = std::max<int>(2, static_cast<int>((600ull << 20) / per));
    std::vector<Rows> ws(copies);
    for (int i = 0; i < copies; ++i) make_rows<T>(ws[i], sh.n_in, sh.outs, 7 * i + 1);
    make_x(c, sh.n_in, xbuf, 3);
    const XBlock* xq = reinterpret_cast<const XBlock*>(xbuf);
    const XMeta* xm = reinterpret_cast<const XMeta*>(xbuf + sh.n_in / 32 * sizeof(XBlock));
    const auto jobs_of = [&](int i, MatJob* jobs) {
      for (size_t j = 0; j < sh.outs.size(); ++j)
        jobs[j] = MatJob{&ws[i % copies].m[j], y + j * 200000, nullptr, false};
      return static_cast<int>(sh.outs.size());
    };
    const auto report = [&](const char* what, double us) {
      printf("%-5s %-7s %-28s %7.2f us  %6.0f GB/s\n", tn, sh.name, what, us, per / us / 1e3);
    };
    printf("(* chosen by st_shape)\n");
    report("matmuls (matvec_q)", time_us(c, [&](int i) {
             MatJob jobs[3];
             matvec(c, nullptr, 1, jobs, jobs_of(i, jobs), xq, xm);
           }));
    const auto staged = [&](StShape s) {
      MatJob probe[3];
      const StShape e = st_shape(c, probe, jobs_of(0, probe), pk.stride(), s);
      const size_t smem = staged_smem(e.r, e.stages, pk.stride());
      if (smem > c.smem_block || smem * e.per_sm > c.smem_sm) return;  // does not fit
      char name[64];
      snprintf(name, sizeof name, "staged R=%d%s per_sm=%d st=%d%s", e.r, s.r ? "" : "*", e.per_sm,
               e.stages, s.stages ? "" : "*");
      report(name, time_us(c, [&](int i) {
               MatJob jobs[3];
               launch_staged<T>(c, jobs, jobs_of(i, jobs), xq, xm, sh.n_in, s);
             }));
    };
    staged({0, 1, 0});
    for (int r : {2, 4})
      for (int per_sm : {1, 2, 3}) staged({r, per_sm, 0});
    for (int st : {4, 8, 12, 16}) staged({0, 1, st});
    fflush(stdout);
  }
}

int trial(Ctx& c, const std::vector<Shape>& shapes, float* y, uint8_t* xbuf) {
  cudaDeviceProp prop{};
  KVS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major < 9) {
    printf("trial: the staged kernel needs compute capability 9.0 (this GPU: %d.%d)\n", prop.major,
           prop.minor);
    return 2;
  }
  c.n_sm = prop.multiProcessorCount;
  c.smem_sm = prop.sharedMemPerMultiprocessor, c.smem_block = prop.sharedMemPerBlockOptin;
  int bad = check<DType::Q4_0>(c, "q4_0", y, xbuf) + check<DType::Q4_1>(c, "q4_1", y, xbuf) +
            check<DType::Q8_0>(c, "q8_0", y, xbuf);
  printf("trial: %s\n", bad ? "MISMATCH" : "every check gave the same bits");
  if (bad) return 1;
  trial_times<DType::Q4_0>(c, "q4_0", shapes, y, xbuf);
  trial_times<DType::Q8_0>(c, "q8_0", shapes, y, xbuf);
  return 0;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "sweep";
  if (mode != "sweep" && mode != "trial") {
    fprintf(stderr, "usage: kvs_matvec_sweep [sweep|trial]\n");
    return 2;
  }
  pdl_enabled() = getenv("PDL") ? atoi(getenv("PDL")) : 1;
  Ctx c;
  KVS_CUDA_CHECK(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
  std::vector<Shape> shapes = {{"qkv", 4096, {4096, 1024, 1024}}, {"wo", 4096, {4096}},
                               {"gateup", 4096, {14336, 14336}},  {"down", 14336, {4096}},
                               {"q3gu", 4096, {12288, 12288}},    {"q3down", 12288, {4096}},
                               {"output", 4096, {128256}}};
  float* y;
  KVS_CUDA_CHECK(cudaMalloc(&y, 3 * 200000 * sizeof(float)));
  uint8_t* xbuf;
  KVS_CUDA_CHECK(cudaMalloc(&xbuf, xq_bytes(16384, 8)));
  float* x;
  KVS_CUDA_CHECK(cudaMalloc(&x, 16384 * sizeof(float)));
  std::vector<float> hx(16384);
  for (size_t i = 0; i < hx.size(); ++i) hx[i] = std::sin(i * 0.37f);
  cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice);
  const int nb = 16384 / 32;
  launch(quantize_x, nb / 8, 256, 0, c.stream, x, reinterpret_cast<XBlock*>(xbuf),
         reinterpret_cast<XMeta*>(xbuf + nb * sizeof(XBlock)), nb);
  if (mode == "trial") return trial(c, shapes, y, xbuf);
  auto sweep = [&]<DType T>(const char* tn) {
    constexpr Packed pk = packed(T);
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
      const XBlock* xq = reinterpret_cast<const XBlock*>(xbuf);
      const int nbx = sh.n_in / 32;
      const XMeta* xm = reinterpret_cast<const XMeta*>(xbuf + nbx * sizeof(XBlock));
      const double bytes = static_cast<double>(per);
      run_variant<T, 2, 2, false>(c, tn, sh, ws, y, xq, xm, bytes);
      run_variant<T, 4, 2, false>(c, tn, sh, ws, y, xq, xm, bytes);
      run_variant<T, 1, 2, false>(c, tn, sh, ws, y, xq, xm, bytes);
      run_variant<T, 2, 4, false>(c, tn, sh, ws, y, xq, xm, bytes);
      run_variant<T, 4, 4, false>(c, tn, sh, ws, y, xq, xm, bytes);
      run_variant<T, 2, 1, true>(c, tn, sh, ws, y, xq, xm, bytes);
      run_variant<T, 4, 1, true>(c, tn, sh, ws, y, xq, xm, bytes);
      if constexpr (packed(T).quant == 16) {  // 8 rows of 8-bit quants would spill
        run_variant<T, 8, 2, false>(c, tn, sh, ws, y, xq, xm, bytes);
        run_variant<T, 8, 1, true>(c, tn, sh, ws, y, xq, xm, bytes);
      }
      for (void* p : raw) cudaFree(p);
      fflush(stdout);
    }
  };
  sweep.template operator()<DType::Q4_0>("q4_0");
  sweep.template operator()<DType::Q8_0>("q8_0");
  return 0;
}
