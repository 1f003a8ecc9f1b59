// The engine's arithmetic does not depend on how the work is cut: prompt chunks of any size,
// including one token at a time (the decode kernels), give bit-identical logits. Streaming
// relies on the same property of the span partials.
#include <gtest/gtest.h>

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

TEST(Engine, DeviceCapacityIsAClearError) {
  auto m = Model::load("synthetic:tiny");
  auto dev = make_cpu_device(64 << 10);
  EngineOptions o;
  o.n_ctx = 4096;
  EXPECT_THROW(Engine(*m, *dev, o), Error);
}

}  // namespace
}  // namespace kvs
