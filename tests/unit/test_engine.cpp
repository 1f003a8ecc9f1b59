// The engine's arithmetic does not depend on how the work is cut: prompt chunks of any size,
// including one token at a time (the decode kernels), give bit-identical logits. Streaming
// relies on the same property of the span partials.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kvs/backend/device.h"
#include "kvs/engine/engine.h"
#include "kvs/model/model.h"
#include "kvs/util/error.h"

namespace kvs {
namespace {

std::vector<float> logits_of(const Model& m, const std::vector<int32_t>& prompt, int32_t batch,
                             int32_t page, DType kt, DType vt) {
  auto dev = make_cpu_device(0);
  EngineOptions o;
  o.n_ctx = 1024;
  o.n_batch = batch;
  o.page_size = page;
  o.k_type = kt;
  o.v_type = vt;
  Engine e(m, *dev, o);
  Sequence s = e.open_sequence();
  const float* l = e.eval(s, prompt.data(), static_cast<int32_t>(prompt.size()));
  return std::vector<float>(l, l + m.config.n_vocab);
}

std::vector<int32_t> prompt_of(int n, int vocab) {
  std::vector<int32_t> p;
  uint32_t x = 7;
  for (int i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    p.push_back(static_cast<int32_t>((x >> 8) % static_cast<uint32_t>(vocab)));
  }
  return p;
}

class EngineExact : public ::testing::TestWithParam<const char*> {};

TEST_P(EngineExact, BatchSizeDoesNotChangeLogits) {
  auto m = Model::load(std::string("synthetic:") + GetParam());
  const auto prompt = prompt_of(333, m->config.n_vocab);
  for (DType kv : {DType::F16, DType::Q8_0, DType::Q4_0}) {
    const auto ref = logits_of(*m, prompt, 512, 32, kv, kv);
    for (int32_t b : {1, 5, 64, 100}) {
      const auto got = logits_of(*m, prompt, b, 32, kv, kv);
      EXPECT_EQ(std::memcmp(ref.data(), got.data(), ref.size() * sizeof(float)), 0)
          << GetParam() << " kv " << dtype_name(kv) << " batch " << b;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, EngineExact,
                         ::testing::Values("tiny", "tiny-qwen2", "tiny-qwen3:q4_0", "tiny:q4_1"));

TEST(Engine, ContextLimitIsAClearError) {
  auto m = Model::load("synthetic:tiny");
  auto dev = make_cpu_device(0);
  EngineOptions o;
  o.n_ctx = 16;
  o.page_size = 8;
  Engine e(*m, *dev, o);
  Sequence s = e.open_sequence();
  std::vector<int32_t> p(10, 3);
  e.eval(s, p.data(), 10);
  try {
    e.eval(s, p.data(), 10);
    FAIL() << "eval past -c succeeded";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("--ctx-size"), std::string::npos) << err.what();
  }
  e.close_sequence(s);
  Sequence s2 = e.open_sequence();  // the frames came back: a full context fits again
  std::vector<int32_t> full(16, 5);
  EXPECT_NO_THROW(e.eval(s2, full.data(), 16));
}

// Decode steps reuse a layer's spans while its frames stay: a slot reopened for another
// sequence, and two sequences taking frames in turn, still attend over their own pages.
TEST(Engine, SequencesTakingTurnsDecodeExactly) {
  auto m = Model::load("synthetic:tiny");
  const int32_t V = m->config.n_vocab;
  const auto a = prompt_of(37, V), b = prompt_of(29, V + 1), c = prompt_of(41, V - 1);
  const auto fresh = [&](const std::vector<int32_t>& p) {
    return logits_of(*m, p, 512, 8, DType::Q8_0, DType::Q8_0);
  };
  auto dev = make_cpu_device(0);
  EngineOptions o;
  o.n_ctx = 64;
  o.page_size = 8;
  o.n_seq = 2;
  o.k_type = o.v_type = DType::Q8_0;
  Engine e(*m, *dev, o);
  const auto same = [&](const float* got, const std::vector<float>& want, const char* what) {
    EXPECT_EQ(std::memcmp(got, want.data(), want.size() * sizeof(float)), 0) << what;
  };
  Sequence s = e.open_sequence();
  for (int32_t t : a) e.eval(s, &t, 1);
  same(e.logits(0), fresh(a), "the first sequence");
  e.close_sequence(s);
  Sequence x = e.open_sequence(), y = e.open_sequence();  // x takes the first one's slot
  for (size_t i = 0; i < std::max(b.size(), c.size()); ++i) {
    if (i < b.size()) e.eval(x, &b[i], 1);
    if (i < c.size()) e.eval(y, &c[i], 1);
  }
  const float* lx = e.eval(x, &c[0], 1);
  auto bx = b;
  bx.push_back(c[0]);
  same(lx, fresh(bx), "the slot reopened");
  same(
      e.eval(y, &b[0], 1),
      [&] {
        auto cy = c;
        cy.push_back(b[0]);
        return fresh(cy);
      }(),
      "the second slot");
}

TEST(Engine, DeviceCapacityIsAClearError) {
  auto m = Model::load("synthetic:tiny");
  auto dev = make_cpu_device(64 << 10);
  EngineOptions o;
  o.n_ctx = 4096;
  EXPECT_THROW(Engine(*m, *dev, o), Error);
}

}  // namespace
}  // namespace kvs
