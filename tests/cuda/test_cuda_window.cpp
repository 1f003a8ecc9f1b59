// Gemma 3's operations on the CUDA backend against the CPU backend: geglu, scale, and the
// sliding window of attention (AttentionArgs::window) in decode and prefill, in one call and in
// several as a streamed run makes them, and in recorded steps (skipped without a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/compare.h"
#include "kvs/backend/cuda/backend.h"
#include "kvs/backend/device.h"
#include "kvs/quant/types.h"

namespace kvs {
namespace {

TEST(CudaWindow, GegluAndScale) {
  NEED_GPU();
  const int64_t n = 3 * 1152 + 7;  // not a whole number of blocks
  const auto x = rnd(static_cast<size_t>(n), 51, 2.0f), y = rnd(static_cast<size_t>(n), 52);
  {
    std::vector<float> c = x;
    cpu->geglu(c.data(), y.data(), n);
    Buf g(*gpu, x), u(*gpu, y);
    gpu->geglu(g.f(), u.f(), n);
    EXPECT_LT(max_rel(c, g.get()), 1e-5) << "geglu";
  }
  {
    std::vector<float> c = x;
    cpu->scale(c.data(), 25.3f, n);
    Buf g(*gpu, x);
    gpu->scale(g.f(), 25.3f, n);
    EXPECT_EQ(c, g.get()) << "scale: one rounded product each";
  }
}

struct Shape {
  DType k, v;
  int d, n_kv, n_head;
};
// Gemma 3 270M's heads, and grouped heads of 128: tensor cores (for heads of 256 where a block's
// shared memory holds their tiles; CUDA cores on the consumer cards).
const Shape kShapes[] = {{DType::F16, DType::F16, 256, 1, 4},
                         {DType::Q8_0, DType::Q8_0, 256, 1, 4},
                         {DType::F16, DType::F16, 128, 2, 8},
                         {DType::Q8_0, DType::Q8_0, 128, 2, 8}};
// Within a page, several pages of 16, neither aligned to pages, and aligned to both sizes.
const int kWindows[] = {5, 40, 300, 512};
constexpr int kCtx = 1500;  // 93 x 16 + 12, 5 x 256 + 220

std::string describe(const Shape& s, int P, int w) {
  return std::string(dtype_name(s.k)) + "/" + dtype_name(s.v) + " d " + std::to_string(s.d) +
         " group " + std::to_string(s.n_head / s.n_kv) + " page " + std::to_string(P) + " window " +
         std::to_string(w);
}

// A cache of kCtx random K and V rows in pages (the last cut short), written by the CPU, and
// its copy on the GPU.
struct Cache {
  KvLayout l;
  int pages;
  std::vector<uint8_t> host;
  DeviceBuffer dev;
  std::vector<Span> sc, sg;  // the pages as spans over the CPU's and the GPU's copies
  Cache(Device& cpu, Device& gpu, const Shape& s, int P)
      : l(KvLayout::make(s.k, s.v, P, s.n_kv, s.d)), pages((kCtx + P - 1) / P) {
    host.assign(pages * l.page_bytes(), 0);
    const size_t row = static_cast<size_t>(s.n_kv) * s.d;
    const auto k = rnd(kCtx * row, 61), v = rnd(kCtx * row, 62);
    std::vector<uint8_t*> dst(kCtx);
    std::vector<int32_t> slots(kCtx);
    for (int t = 0; t < kCtx; ++t)
      dst[t] = host.data() + (t / P) * l.page_bytes(), slots[t] = t % P;
    cpu.kv_write(l, k.data(), v.data(), kCtx, dst.data(), slots.data());
    dev = gpu.alloc(host.size(), "pages");
    gpu.upload(dev.as(), host.data(), host.size());
    std::tie(sc, sg) = page_spans(host.data(), dev.as(), l, kCtx);
  }
};

// The queries at pos (ascending) with window w: the GPU against the CPU over every page in one
// call, and the GPU's one call against three (the state carried as a ring's chunks carry it)
// that must give the same bits: the pages wholly before the first query's window (nothing
// visible, the state stays empty), then the rest in two.
void check_window(Device& cpu, Device& gpu, const Shape& s, int P, int w,
                  const std::vector<int32_t>& pos, const std::string& what) {
  const Cache c(cpu, gpu, s, P);
  const int n_tok = static_cast<int>(pos.size());
  const auto q = rnd(static_cast<size_t>(n_tok) * s.n_head * s.d, 63, 2.0f);
  AttentionArgs a = attention_args(c.l, pos, s.n_head, 1.0f / std::sqrt(static_cast<float>(s.d)));
  a.window = w;
  std::vector<float> oc(q.size()), accc(static_cast<size_t>(n_tok) * s.n_head * 2);
  a.q = q.data(), a.out = oc.data(), a.acc = accc.data(), a.spans = c.sc.data(),
  a.n_spans = c.pages;
  cpu.attention(a);
  Buf qg(gpu, q), og(gpu, q.size()), ag(gpu, accc.size());
  a.q = qg.f(), a.out = og.f(), a.acc = ag.f(), a.spans = c.sg.data();
  gpu.attention(a);
  const auto one = og.get();
  EXPECT_LT(max_rel(oc, one), 4e-3) << what;
  const int before = (pos[0] - w + 1) / P;
  ASSERT_GT(before, 0) << what << ": no page before the window";
  const int cuts[] = {0, before, before + (c.pages - before) / 2, c.pages};
  for (int i = 0; i < 3; ++i) {
    a.spans = c.sg.data() + cuts[i], a.n_spans = cuts[i + 1] - cuts[i];
    a.first = i == 0, a.last = i == 2;
    gpu.attention(a);
  }
  const auto three = og.get();
  EXPECT_EQ(0, std::memcmp(one.data(), three.data(), one.size() * sizeof(float)))
      << what << ": three calls differ from one, by " << max_rel(one, three);
}

// One query at the end of the context; both ways to split the decode work (the tensor-core
// kernel's: a block per span, its warps' parts merged, and a warp per span, the fold inside
// the launch; heads of 256 on a consumer card take neither).
TEST(CudaWindow, DecodeAgainstCpu) {
  NEED_GPU();
  for (const bool by_warp : {false, true}) {
    CudaOptions opt;
    opt.decode_split =
        by_warp ? CudaOptions::DecodeSplit::WarpPerSpan : CudaOptions::DecodeSplit::BlockPerSpan;
    gpu = make_cuda_device(0, opt);
    for (const Shape& s : kShapes)
      for (const int P : {16, 256})
        for (const int w : kWindows)
          check_window(*cpu, *gpu, s, P, w, {kCtx - 1},
                       "decode " + describe(s, P, w) + (by_warp ? ", a warp per span" : ""));
  }
}

// 530 queries at the end of the context: windows differ from row to row, and blocks' first
// tiles and spans lie before all of their rows' windows.
TEST(CudaWindow, PrefillAgainstCpu) {
  NEED_GPU();
  for (const Shape& s : kShapes)
    for (const int P : {16, 256})
      for (const int w : kWindows)
        check_window(*cpu, *gpu, s, P, w, last_positions(kCtx, 530),
                     "prefill " + describe(s, P, w));
}

// A recorded step whose launches are all the same as the last one's relaunches its graph: a
// step that differs only in the window must not. Steps of geglu and decode attention (a warp
// per span, which in a recorded step copies before its wait), with windows 40, 300 and 40
// again, each against the CPU.
TEST(CudaWindow, RecordedStepsTakeTheirWindow) {
  NEED_GPU();
  CudaOptions opt;
  opt.decode_split = CudaOptions::DecodeSplit::WarpPerSpan;
  gpu = make_cuda_device(0, opt);
  const Shape s{DType::F16, DType::F16, 128, 2, 8};
  const Cache c(*cpu, *gpu, s, 16);
  const std::vector<int32_t> pos{kCtx - 1};
  const auto q = rnd(static_cast<size_t>(s.n_head) * s.d, 64, 2.0f);
  const auto x = rnd(4096, 65), y = rnd(4096, 66);
  Buf qg(*gpu, q), og(*gpu, q.size()), ag(*gpu, static_cast<size_t>(s.n_head) * 2);
  Buf xg(*gpu, x.size()), yg(*gpu, y);
  for (const int w : {40, 300, 40}) {
    AttentionArgs a = attention_args(c.l, pos, s.n_head, 1.0f / std::sqrt(128.0f));
    a.window = w;
    std::vector<float> oc(q.size()), accc(static_cast<size_t>(s.n_head) * 2), xc = x;
    a.q = q.data(), a.out = oc.data(), a.acc = accc.data(), a.spans = c.sc.data(),
    a.n_spans = c.pages;
    cpu->attention(a);
    cpu->geglu(xc.data(), y.data(), static_cast<int64_t>(x.size()));
    gpu->upload(xg.f(), x.data(), x.size() * sizeof(float));
    a.q = qg.f(), a.out = og.f(), a.acc = ag.f(), a.spans = c.sg.data();
    gpu->begin_step();
    gpu->geglu(xg.f(), yg.f(), static_cast<int64_t>(x.size()));
    gpu->attention(a);
    gpu->end_step(true);
    EXPECT_LT(max_rel(oc, og.get()), 4e-3) << "window " << w;
    EXPECT_LT(max_rel(xc, xg.get()), 1e-5) << "geglu, window " << w;
  }
}

}  // namespace
}  // namespace kvs
