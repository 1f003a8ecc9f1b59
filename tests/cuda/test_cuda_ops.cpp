// Every Device operation of the CUDA backend against the CPU backend on random inputs, one at
// a time, so a mismatch names its kernel (skipped without a GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cuda/compare.h"
#include "kvs/backend/cuda/backend.h"
#include "kvs/backend/device.h"
#include "kvs/model/model.h"
#include "kvs/quant/types.h"
#include "kvs/util/error.h"
#include "kvs/util/threadpool.h"

namespace kvs {
namespace {

TEST(CudaOps, MatmulEveryFormat) {
  NEED_GPU();
  // tiny-h128's rows are all multiples of 256: no fallback from the K and IQ4_XS blocks (and
  // a quarter of a 1024-element group of the integer kernel).
  for (const char* wt :
       {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "h128:q4_k",
        "h128:q5_k", "h128:q6_k", "h128:iq4_xs", "h128:q3_k", "h128:q2_k"}) {
    auto m = Model::load(std::string("synthetic:tiny-") + (wt[0] == 'h' ? "" : "qwen3:") + wt);
    const Weights wc = cpu->place_weights(m->weights);
    const Weights wg = gpu->place_weights(m->weights);
    for (int which = 0; which < 2; ++which) {
      const Matrix& mc = which ? wc.layers[0].down : wc.layers[0].wq;
      const Matrix& mg = which ? wg.layers[0].down : wg.layers[0].wq;
      for (int64_t n_tok : {1, 3, 8, 9, 40}) {
        const auto x = rnd(static_cast<size_t>(mc.n_in * n_tok), 1);
        std::vector<float> yc(static_cast<size_t>(mc.n_out * n_tok));
        cpu->matmul(mc, x.data(), yc.data(), n_tok, nullptr);
        Buf xg(*gpu, x), yg(*gpu, yc.size());
        gpu->matmul(mg, xg.f(), yg.f(), n_tok, nullptr);
        // Matrix-vector products keep f32 (or x in two int8 planes, to 2e-5); more tokens go
        // through f16 tiles and cuBLAS.
        EXPECT_LT(max_rel(yc, yg.get()), n_tok <= 8 ? 2e-4 : 5e-3)
            << wt << " " << dtype_name(mc.type) << " n_tok " << n_tok << " rows " << mc.n_out;
      }
    }
  }
}

// The integer matrix-vector kernel on rows of several 1024-element groups and a partial one
// (SmolLM2's shape: 576 and 1536 columns), with the residual add and a bias.
TEST(CudaOps, MatvecLongRowsAddAndBias) {
  NEED_GPU();
  for (const char* wt : {"q8_0", "q4_0", "q4_1"}) {
    auto m = Model::load(std::string("synthetic:smollm2-135m:") + wt);
    const Weights wc = cpu->place_weights(m->weights);
    const Weights wg = gpu->place_weights(m->weights);
    for (int which = 0; which < 2; ++which) {
      const Matrix& mc = which ? wc.layers[1].down : wc.layers[1].up;
      const Matrix& mg = which ? wg.layers[1].down : wg.layers[1].up;
      for (int64_t n_tok : {1, 2, 5}) {
        const auto x = rnd(static_cast<size_t>(mc.n_in * n_tok), 8);
        const auto y0 = rnd(static_cast<size_t>(mc.n_out * n_tok), 9);
        const auto bias = rnd(static_cast<size_t>(mc.n_out), 10);
        std::vector<float> yc = y0;
        Buf bg(*gpu, bias);
        const MatJob jc{&mc, yc.data(), bias.data(), true};
        cpu->matmuls(x.data(), n_tok, &jc, 1);
        Buf xg(*gpu, x), yg(*gpu, y0);
        const MatJob jg{&mg, yg.f(), bg.f(), true};
        gpu->matmuls(xg.f(), n_tok, &jg, 1);
        EXPECT_LT(max_rel(yc, yg.get()), 2e-4)
            << wt << " n_in " << mc.n_in << " n_tok " << n_tok << " rows " << mc.n_out;
      }
    }
  }
}

// Rows of 4096 and more are normalized by several blocks a row (one token to a few).
TEST(CudaOps, RmsnormWideRows) {
  NEED_GPU();
  for (int64_t rows : {1, 3}) {
    const int64_t n = 4096;
    const auto x = rnd(static_cast<size_t>(rows * n), 21), w = rnd(static_cast<size_t>(n), 22);
    std::vector<float> c(x.size());
    cpu->rmsnorm(x.data(), w.data(), c.data(), rows, n, 1e-5f);
    Buf xg(*gpu, x), wg(*gpu, w), og(*gpu, x.size());
    gpu->rmsnorm(xg.f(), wg.f(), og.f(), rows, n, 1e-5f);
    EXPECT_LT(max_rel(c, og.get()), 1e-5) << "rows " << rows;
  }
}

// The 8B models' shapes, against the CPU: rows of 14336 columns (the down product: the kernel
// keeps a group of loads ahead), 4096 rows of 4096 (4 rows a warp, two warps to each 4), 6144
// rows (8 rows a warp for 4-bit formats).
TEST(CudaOps, MatvecEightBShapes) {
  NEED_GPU();
  for (DType t : {DType::Q4_0, DType::Q8_0, DType::Q4_1}) {
    for (const auto& [n_in, n_out] :
         {std::pair<int64_t, int64_t>{14336, 4608}, {4096, 4096}, {4096, 6144}}) {
      const auto f = rnd(static_cast<size_t>(n_in * n_out), 23);
      const size_t rb = row_bytes(t, n_in);
      std::vector<uint8_t> q(rb * static_cast<size_t>(n_out));
      for (int64_t r = 0; r < n_out; ++r)
        quantize_row(t, f.data() + r * n_in, q.data() + static_cast<size_t>(r) * rb, n_in);
      Weights hw;
      hw.tok_embd = Matrix{t, n_in, n_out, rb, q.data()};
      hw.output = hw.tok_embd;  // tied: placed once
      const Weights cw = cpu->place_weights(hw), gw = gpu->place_weights(hw);
      for (int64_t n_tok : {1, 2}) {
        const auto x = rnd(static_cast<size_t>(n_in * n_tok), 24);
        std::vector<float> yc(static_cast<size_t>(n_out * n_tok));
        cpu->matmul(cw.tok_embd, x.data(), yc.data(), n_tok, nullptr);
        Buf xg(*gpu, x), yg(*gpu, yc.size());
        gpu->matmul(gw.tok_embd, xg.f(), yg.f(), n_tok, nullptr);
        EXPECT_LT(max_rel(yc, yg.get()), 2e-4)
            << dtype_name(t) << " " << n_out << " x " << n_in << " n_tok " << n_tok;
      }
    }
  }
}

// The integer kernel on the formats of 32-element sub-blocks (k-quants, iq4): rows of 14336
// (one group ahead), 4100 rows of 4096 (8 rows a warp for 4-bit and smaller formats), rows of
// 2304 (two groups and a quarter), row counts that no kernel's tile divides; two matrices in one
// launch, the second added to y with a bias; one to 8 tokens.
TEST(CudaOps, MatvecSubBlockFormats) {
  NEED_GPU();
  for (DType t : {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q3_K, DType::Q2_K, DType::IQ4_XS,
                  DType::IQ4_NL}) {
    for (const auto& [n_in, n_out] :
         {std::pair<int64_t, int64_t>{14336, 1030}, {4096, 4100}, {2304, 1003}}) {
      const int64_t n_out2 = 37;  // the second matrix's rows
      const auto f = rnd(static_cast<size_t>(n_in * (n_out + n_out2)), 25);
      const size_t rb = row_bytes(t, n_in);
      std::vector<uint8_t> q(rb * static_cast<size_t>(n_out + n_out2));
      thread_pool().parallel_for(n_out + n_out2, 16, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r)
          quantize_row(t, f.data() + r * n_in, q.data() + static_cast<size_t>(r) * rb, n_in);
      });
      Weights hw;
      hw.tok_embd = Matrix{t, n_in, n_out, rb, q.data()};
      hw.output = Matrix{t, n_in, n_out2, rb, q.data() + rb * static_cast<size_t>(n_out)};
      const Weights cw = cpu->place_weights(hw), gw = gpu->place_weights(hw);
      const auto bias = rnd(static_cast<size_t>(n_out2), 26);
      Buf bg(*gpu, bias);
      for (int64_t n_tok : {1, 2, 3, 5, 8}) {
        const auto x = rnd(static_cast<size_t>(n_in * n_tok), 27);
        const auto y0 = rnd(static_cast<size_t>(n_out2 * n_tok), 28);
        std::vector<float> yc(static_cast<size_t>(n_out * n_tok)), yc2 = y0;
        const MatJob jc[2] = {{&cw.tok_embd, yc.data(), nullptr, false},
                              {&cw.output, yc2.data(), bias.data(), true}};
        cpu->matmuls(x.data(), n_tok, jc, 2);
        Buf xg(*gpu, x), yg(*gpu, yc.size()), yg2(*gpu, y0);
        const MatJob jg[2] = {{&gw.tok_embd, yg.f(), nullptr, false},
                              {&gw.output, yg2.f(), bg.f(), true}};
        gpu->matmuls(xg.f(), n_tok, jg, 2);
        EXPECT_LT(max_rel(yc, yg.get()), 2e-4)
            << dtype_name(t) << " " << n_out << " x " << n_in << " n_tok " << n_tok;
        EXPECT_LT(max_rel(yc2, yg2.get()), 2e-4)
            << dtype_name(t) << " " << n_out2 << " x " << n_in << " (added, bias) n_tok " << n_tok;
      }
    }
  }
}

TEST(CudaOps, NormsRopeActivations) {
  NEED_GPU();
  const int n_tok = 5, n_head = 4, d = 64;
  const auto x = rnd(n_tok * n_head * d, 2), w = rnd(d, 3), y = rnd(n_tok * n_head * d, 4);
  {
    std::vector<float> c(x.size());
    cpu->rmsnorm(x.data(), w.data(), c.data(), n_tok * n_head, d, 1e-5f);
    Buf xg(*gpu, x), wg(*gpu, w), og(*gpu, x.size());
    gpu->rmsnorm(xg.f(), wg.f(), og.f(), n_tok * n_head, d, 1e-5f);
    EXPECT_LT(max_rel(c, og.get()), 1e-5) << "rmsnorm";
  }
  for (RopeMode mode : {RopeMode::Norm, RopeMode::Neox}) {
    RopeParams p;
    p.mode = mode;
    p.head_dim = d;
    p.rope_dim = d;
    p.base = 10000.0f;
    const std::vector<int32_t> pos{0, 1, 17, 300, 4000};
    // q of n_head heads and k of n_head / 2 (the second half of y) in one call.
    const std::vector<float> k0(y.begin(), y.begin() + n_tok * (n_head / 2) * d);
    std::vector<float> c = x, ck = k0;
    cpu->rope(c.data(), ck.data(), pos.data(), n_tok, n_head, n_head / 2, p);
    Buf g(*gpu, x), gk(*gpu, k0);
    gpu->rope(g.f(), gk.f(), pos.data(), n_tok, n_head, n_head / 2, p);
    EXPECT_LT(max_rel(c, g.get()), 1e-5) << "rope q " << int(mode);
    EXPECT_LT(max_rel(ck, gk.get()), 1e-5) << "rope k " << int(mode);
  }
  {
    std::vector<float> c = x;
    cpu->swiglu(c.data(), y.data(), static_cast<int64_t>(x.size()));
    Buf g(*gpu, x), u(*gpu, y);
    gpu->swiglu(g.f(), u.f(), static_cast<int64_t>(x.size()));
    EXPECT_LT(max_rel(c, g.get()), 1e-5) << "swiglu";
  }
  {
    std::vector<float> c = x;
    cpu->add(c.data(), y.data(), static_cast<int64_t>(x.size()));
    Buf g(*gpu, x), u(*gpu, y);
    gpu->add(g.f(), u.f(), static_cast<int64_t>(x.size()));
    EXPECT_LT(max_rel(c, g.get()), 1e-6) << "add";
  }
}

// rope_kv_write (one launch) against rope then kv_write: the same q, k and page bytes.
TEST(CudaOps, RopeKvWriteFused) {
  NEED_GPU();
  const int n_tok = 3, n_head = 8, n_kv = 2, P = 16;
  const std::vector<int32_t> pos{5, 16, 4000}, slots{5, 0, 3};
  for (const int d : {64, 128})
    for (const RopeMode mode : {RopeMode::Norm, RopeMode::Neox})
      for (const auto& [kt, vt] : {std::pair{DType::F16, DType::F16},
                                   {DType::Q8_0, DType::Q8_0},
                                   {DType::Q8_0, DType::Q4_0}}) {
        RopeParams p;
        p.mode = mode;
        p.head_dim = d;
        p.rope_dim = mode == RopeMode::Neox ? d / 2 : d;  // a partial rope too
        p.base = 500000.0f;
        const KvLayout l = KvLayout::make(kt, vt, P, n_kv, d);
        const auto q = rnd(n_tok * n_head * d, 8), k = rnd(n_tok * n_kv * d, 9),
                   v = rnd(n_tok * n_kv * d, 10);
        std::vector<std::vector<uint8_t>> pages;
        std::vector<float> qs[2], ks[2];
        for (const bool fused : {false, true}) {
          DeviceBuffer pg = gpu->alloc(2 * l.page_bytes(), "pages");
          std::vector<uint8_t> h(2 * l.page_bytes(), 0);
          gpu->upload(pg.as(), h.data(), h.size());
          // Token 0 on page 0, tokens 1 and 2 on page 1.
          const std::vector<uint8_t*> dst{pg.as(), pg.as() + l.page_bytes(),
                                          pg.as() + l.page_bytes()};
          Buf qg(*gpu, q), kg(*gpu, k), vg(*gpu, v);
          if (fused) {
            gpu->rope_kv_write(qg.f(), kg.f(), vg.f(), pos.data(), n_tok, n_head, p, l, dst.data(),
                               slots.data());
          } else {
            gpu->rope(qg.f(), kg.f(), pos.data(), n_tok, n_head, n_kv, p);
            gpu->kv_write(l, kg.f(), vg.f(), n_tok, dst.data(), slots.data());
          }
          gpu->sync();
          gpu->download(h.data(), pg.as(), h.size());
          pages.push_back(h);
          qs[fused] = qg.get(), ks[fused] = kg.get();
        }
        const std::string what = std::string(dtype_name(kt)) + "/" + dtype_name(vt) + " d " +
                                 std::to_string(d) + " mode " + std::to_string(int(mode));
        EXPECT_EQ(qs[0], qs[1]) << what;
        EXPECT_EQ(ks[0], ks[1]) << what;
        EXPECT_EQ(pages[0], pages[1]) << what;
      }
}

// Qwen3's q and k head norms inside the rope's launch against two rmsnorm launches before a
// rope without them (the path of other head sizes): the same q, k and page bytes.
TEST(CudaOps, RopeKvWriteWithHeadNorms) {
  NEED_GPU();
  const int n_tok = 3, n_head = 7, n_kv = 3, P = 16;  // 7 q heads: a block of 3
  const std::vector<int32_t> pos{5, 16, 4000}, slots{5, 0, 3};
  for (const int d : {64, 128})
    for (const auto& [kt, vt] : {std::pair{DType::F16, DType::F16}, {DType::Q8_0, DType::Q4_0}}) {
      RopeParams p;
      p.mode = RopeMode::Neox;
      p.head_dim = d;
      p.rope_dim = d;
      p.base = 1000000.0f;
      const KvLayout l = KvLayout::make(kt, vt, P, n_kv, d);
      const auto q = rnd(n_tok * n_head * d, 11, 4.0f), k = rnd(n_tok * n_kv * d, 12, 4.0f),
                 v = rnd(n_tok * n_kv * d, 13), qw = rnd(d, 14), kw = rnd(d, 15);
      std::vector<uint8_t> pages[2];
      std::vector<float> qs[2], ks[2];
      for (int f = 0; f < 2; ++f) {
        Device& dev = *gpu;
        DeviceBuffer pg = dev.alloc(2 * l.page_bytes(), "pages");
        std::vector<uint8_t> h(2 * l.page_bytes(), 0);
        dev.upload(pg.as(), h.data(), h.size());
        const std::vector<uint8_t*> dst{pg.as(), pg.as() + l.page_bytes(),
                                        pg.as() + l.page_bytes()};
        Buf qg(dev, q), kg(dev, k), vg(dev, v), qn(dev, qw), kn(dev, kw);
        const QkNorm norm{qn.f(), kn.f(), 1e-6f};
        if (f == 0) {
          dev.rmsnorm(qg.f(), norm.q, qg.f(), int64_t{n_tok} * n_head, d, norm.eps);
          dev.rmsnorm(kg.f(), norm.k, kg.f(), int64_t{n_tok} * n_kv, d, norm.eps);
        }
        dev.rope_kv_write(qg.f(), kg.f(), vg.f(), pos.data(), n_tok, n_head, p, l, dst.data(),
                          slots.data(), f ? &norm : nullptr);
        dev.sync();
        dev.download(h.data(), pg.as(), h.size());
        pages[f] = h;
        qs[f] = qg.get(), ks[f] = kg.get();
      }
      const std::string what =
          std::string(dtype_name(kt)) + "/" + dtype_name(vt) + " d " + std::to_string(d);
      EXPECT_EQ(qs[0], qs[1]) << what;
      EXPECT_EQ(ks[0], ks[1]) << what;
      EXPECT_EQ(pages[0], pages[1]) << what;
    }
}

TEST(CudaOps, EmbedKvWriteAndAttention) {
  NEED_GPU();
  auto m = Model::load("synthetic:tiny-qwen3:q8_0");
  const Weights wc = cpu->place_weights(m->weights);
  const Weights wg = gpu->place_weights(m->weights);
  {
    const std::vector<int32_t> ids{3, 0, 511, 42};
    std::vector<float> c(4 * static_cast<size_t>(wc.tok_embd.n_in));
    cpu->embed(wc.tok_embd, ids.data(), 4, c.data());
    Buf g(*gpu, c.size());
    gpu->embed(wg.tok_embd, ids.data(), 4, g.f());
    EXPECT_LT(max_rel(c, g.get()), 1e-6) << "embed";
  }
  // Head sizes 64, 128 and 256 run on tensor cores (decode and prefill; 256 where a block's
  // shared memory holds its tiles: the H100's, not a consumer card's, whose CUDA cores keep
  // f32), which round Q, K, V and the probabilities to f16.
  double worst_tc = 0;
  const std::pair<DType, DType> kinds[] = {{DType::F16, DType::F16},
                                           {DType::Q8_0, DType::Q8_0},
                                           {DType::Q4_0, DType::Q4_0},
                                           {DType::Q8_0, DType::Q4_0}};
  for (const auto& [kt, vt] : kinds)
    for (int d : {64, 128, 256})
      for (int P : {16, 128})
        for (int32_t n_tok : {1, 7, 70}) {
          const int n_kv = 2, n_head = 8, ctx = 150;
          const KvLayout l = KvLayout::make(kt, vt, P, n_kv, d);
          const int pages = (ctx + P - 1) / P;
          // The same K/V rows written by both backends into pages, then attention over them.
          std::vector<uint8_t> hc(pages * l.page_bytes(), 0), hg(hc.size(), 0);
          DeviceBuffer gp = gpu->alloc(hc.size(), "pages");
          gpu->upload(gp.as(), hg.data(), hg.size());
          const auto k = rnd(ctx * n_kv * d, 5), v = rnd(ctx * n_kv * d, 6);
          std::vector<uint8_t*> dc(ctx), dg(ctx);
          std::vector<int32_t> slots(ctx);
          for (int t = 0; t < ctx; ++t) {
            dc[t] = hc.data() + (t / P) * l.page_bytes();
            dg[t] = gp.as() + (t / P) * l.page_bytes();
            slots[t] = t % P;
          }
          cpu->kv_write(l, k.data(), v.data(), ctx, dc.data(), slots.data());
          Buf kg(*gpu, k), vg(*gpu, v);
          gpu->kv_write(l, kg.f(), vg.f(), ctx, dg.data(), slots.data());
          gpu->sync();
          gpu->download(hg.data(), gp.as(), hg.size());
          size_t differ = 0;
          for (size_t i = 0; i < hc.size(); ++i) {
            if (hc[i] == hg[i]) continue;
            // Name the first few differences: page, K or V, slot, byte within the row.
            if (differ++ < 6) {
              const size_t pg = i / l.page_bytes(), o = i % l.page_bytes();
              const bool is_v = o >= l.v_offset();
              const size_t rb = is_v ? l.v_row : l.k_row, ro = is_v ? o - l.v_offset() : o;
              ADD_FAILURE() << dtype_name(kt) << " page " << pg << (is_v ? " V" : " K") << " slot "
                            << ro / rb << " byte " << ro % rb << ": cpu " << int(hc[i]) << " gpu "
                            << int(hg[i]);
            }
          }
          EXPECT_LE(differ, hc.size() / 1000)
              << "kv_write " << dtype_name(kt) << ": " << differ << " bytes differ";
          const auto q = rnd(n_tok * n_head * d, 7);
          const std::vector<int32_t> pos = last_positions(ctx, n_tok);
          const auto [sc, sg] = page_spans(hc.data(), gp.as(), l, ctx);
          AttentionArgs a = attention_args(l, pos, n_head, 0.125f);
          std::vector<float> oc(q.size()), accc(n_tok * n_head * 2);
          a.q = q.data();
          a.out = oc.data();
          a.acc = accc.data();
          a.spans = sc.data();
          a.n_spans = pages;
          cpu->attention(a);
          // The CUDA run reads the CPU-written pages, so only the attention arithmetic differs.
          gpu->upload(gp.as(), hc.data(), hc.size());
          Buf qg(*gpu, q), og(*gpu, q.size()), ag(*gpu, accc.size());
          a.q = qg.f();
          a.out = og.f();
          a.acc = ag.f();
          a.spans = sg.data();
          gpu->attention(a);
          const double err = max_rel(oc, og.get());
          worst_tc = std::max(worst_tc, err);
          EXPECT_LT(err, 4e-3)
              << "attention " << dtype_name(kt) << "/" << dtype_name(vt) << " head size " << d
              << " page " << P << " n_tok " << n_tok;
        }
  std::printf("worst tensor-core attention difference: %.3g (tolerance 4e-3)\n", worst_tc);
}

// Decode over many short spans (the fold's chunks, a last span cut short, one span past the
// query that must count for nothing): against the CPU, and the same spans in three calls (the
// running state carried, as a ring's chunks are; the call of one span folds in place)
// bit-identical to one call. Both ways to split the work, forced: a block per span (what a
// short context takes; the fold a launch of its own) and a warp per span (a long one; the fold
// inside the attention's launch).
TEST(CudaOps, DecodeAttentionManySpans) {
  NEED_GPU();
  struct Case {
    DType k, v;
    int d, n_kv, n_head;
  };
  const Case cases[] = {{DType::Q8_0, DType::Q8_0, 128, 8, 32},
                        {DType::F16, DType::Q4_0, 128, 2, 16},
                        {DType::Q4_0, DType::F16, 64, 3, 3},
                        {DType::Q8_0, DType::Q4_0, 64, 4, 12}};
  for (const bool by_warp : {false, true}) {
    CudaOptions opt;
    opt.decode_split = by_warp ? CudaOptions::DecodeSplit::WarpPerSpan
                               : CudaOptions::DecodeSplit::BlockPerSpan;
    gpu = make_cuda_device(0, opt);
    for (const Case& cs : cases) {
      // 1500 = 93 x 16 + 12
      const int P = 16, ctx = 1500, d = cs.d, n_kv = cs.n_kv, n_head = cs.n_head;
      const KvLayout l = KvLayout::make(cs.k, cs.v, P, n_kv, d);
      const int pages = (ctx + P - 1) / P + 1;  // the last page starts past the query
      std::vector<uint8_t> hc(pages * l.page_bytes(), 0);
      const auto k = rnd(static_cast<size_t>(pages) * P * n_kv * d, 41);
      const auto v = rnd(static_cast<size_t>(pages) * P * n_kv * d, 42);
      std::vector<uint8_t*> dc(pages * P);
      std::vector<int32_t> slots(pages * P);
      for (int t = 0; t < pages * P; ++t)
        dc[t] = hc.data() + (t / P) * l.page_bytes(), slots[t] = t % P;
      cpu->kv_write(l, k.data(), v.data(), pages * P, dc.data(), slots.data());
      DeviceBuffer gp = gpu->alloc(hc.size(), "pages");
      gpu->upload(gp.as(), hc.data(), hc.size());
      const auto q = rnd(static_cast<size_t>(n_head) * d, 43, 3.0f);  // peaked softmax
      const std::vector<int32_t> pos{ctx - 1};
      std::vector<Span> sc, sg;
      for (int p = 0; p < pages; ++p) {
        const int n = p == pages - 2 ? ctx - p * P : P;
        sc.push_back({hc.data() + p * l.page_bytes(), p * P, n});
        sg.push_back({gp.as() + p * l.page_bytes(), p * P, n});
      }
      AttentionArgs a = attention_args(l, pos, n_head, 1.0f / std::sqrt(static_cast<float>(d)));
      std::vector<float> oc(q.size()), accc(static_cast<size_t>(n_head) * 2);
      a.q = q.data(), a.out = oc.data(), a.acc = accc.data(), a.spans = sc.data(),
      a.n_spans = pages;
      cpu->attention(a);
      Buf qg(*gpu, q), og(*gpu, q.size()), ag(*gpu, accc.size());
      a.q = qg.f(), a.out = og.f(), a.acc = ag.f(), a.spans = sg.data();
      gpu->attention(a);
      const auto one = og.get();
      const std::string what = std::string(dtype_name(cs.k)) + "/" + dtype_name(cs.v) + " d " +
                               std::to_string(d) + " group " + std::to_string(n_head / n_kv) +
                               (by_warp ? ", a warp per span" : ", a block per span");
      EXPECT_LT(max_rel(oc, one), 4e-3) << what;
      const int cuts[] = {0, 40, 41, pages};
      for (int c = 0; c < 3; ++c) {
        a.spans = sg.data() + cuts[c], a.n_spans = cuts[c + 1] - cuts[c];
        a.first = c == 0, a.last = c == 2;
        gpu->attention(a);
      }
      const auto three = og.get();
      EXPECT_EQ(0, std::memcmp(one.data(), three.data(), one.size() * sizeof(float)))
          << what << ": three calls differ from one, by " << max_rel(one, three);
    }
  }
}

// Prefill attention on a quantized cache larger than the f16 conversion scratch (128 MiB): the
// spans go in chunks of half of it, each converted on the side stream while the one before is
// attended to, the running max, sum and output carried from one to the next.
TEST(CudaOps, PrefillAttentionInChunks) {
  NEED_GPU();
  const int n_kv = 8, n_head = 32, d = 128, P = 2048, ctx = 34000, n_tok = 70;
  const KvLayout l = KvLayout::make(DType::Q8_0, DType::Q4_0, P, n_kv, d);
  const int pages = (ctx + P - 1) / P;  // 17 pages of 8 MiB in f16: chunks of 8, 8 and 1
  std::vector<uint8_t> hc(pages * l.page_bytes(), 0);
  const auto k = rnd(static_cast<size_t>(ctx) * n_kv * d, 31);
  const auto v = rnd(static_cast<size_t>(ctx) * n_kv * d, 32);
  std::vector<uint8_t*> dc(ctx);
  std::vector<int32_t> slots(ctx);
  for (int t = 0; t < ctx; ++t) dc[t] = hc.data() + (t / P) * l.page_bytes(), slots[t] = t % P;
  cpu->kv_write(l, k.data(), v.data(), ctx, dc.data(), slots.data());
  DeviceBuffer gp = gpu->alloc(hc.size(), "pages");
  gpu->upload(gp.as(), hc.data(), hc.size());
  const auto q = rnd(static_cast<size_t>(n_tok) * n_head * d, 33);
  const std::vector<int32_t> pos = last_positions(ctx, n_tok);
  const auto [sc, sg] = page_spans(hc.data(), gp.as(), l, ctx);
  AttentionArgs a = attention_args(l, pos, n_head, 0.088f);
  std::vector<float> oc(q.size()), accc(static_cast<size_t>(n_tok) * n_head * 2);
  a.q = q.data(), a.out = oc.data(), a.acc = accc.data(), a.spans = sc.data(), a.n_spans = pages;
  cpu->attention(a);
  Buf qg(*gpu, q), og(*gpu, q.size()), ag(*gpu, accc.size());
  a.q = qg.f(), a.out = og.f(), a.acc = ag.f(), a.spans = sg.data();
  gpu->attention(a);
  const auto one = og.get();
  EXPECT_LT(max_rel(oc, one), 4e-3);
  // The same spans, then a call with none that only ends the state: the same bits.
  a.last = false;
  gpu->attention(a);
  a.first = false, a.last = true, a.n_spans = 0;
  gpu->attention(a);
  const auto two = og.get();
  EXPECT_EQ(0, std::memcmp(one.data(), two.data(), one.size() * sizeof(float)))
      << "an empty last call differs, by " << max_rel(one, two);
}

}  // namespace
}  // namespace kvs
