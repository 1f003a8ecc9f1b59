// ModelConfig::from_gguf on gemma3 files: the layer kinds from each form of the window pattern,
// and the metadata it refuses, each refusal naming the key. The files are tiny-gemma3 with one
// key changed.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "kvs/gguf/gguf.h"
#include "kvs/model/config.h"
#include "kvs/model/synthetic.h"
#include "kvs/util/error.h"

namespace kvs {
namespace {

using gguf::Value;
const std::string kPattern = "gemma3.attention.sliding_window_pattern";

// tiny-gemma3 (7 layers, window 32, context 4096) with `edit` applied to its writer; tensors
// named in `drop` are left out.
std::unique_ptr<gguf::File> gemma_with(const std::function<void(gguf::Writer&)>& edit,
                                       const std::vector<std::string>& drop = {}) {
  static const std::unique_ptr<gguf::File> base = make_synthetic("tiny-gemma3");
  gguf::Writer w;
  for (const auto& [k, v] : base->metadata()) w.set(k, v);
  for (const auto& t : base->tensors()) {
    bool skip = false;
    for (const std::string& d : drop) skip |= t.name == d;
    if (!skip) w.add_tensor(t.name, t.type, t.dims, t.data, t.nbytes);
  }
  edit(w);
  return gguf::File::from_buffer(w.to_bytes(), "edited.gguf");
}

std::string kinds_of(const ModelConfig& c) {
  std::string s;
  for (LayerKind k : c.kinds) s += k == LayerKind::Window ? 'W' : 'F';
  return s;
}

void expect_refused(const gguf::File& f, const std::vector<std::string>& needles) {
  try {
    ModelConfig::from_gguf(f);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const std::string& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

TEST(Gemma3Config, PatternForms) {
  // No key: the period of 6 that every published file implies.
  EXPECT_EQ(kinds_of(ModelConfig::from_gguf(*gemma_with([](gguf::Writer&) {}))), "WWWWWFW");
  auto period = [](int64_t n) {
    return gemma_with(
        [n](gguf::Writer& w) { w.set(kPattern, Value::i32(static_cast<int32_t>(n))); });
  };
  EXPECT_EQ(kinds_of(ModelConfig::from_gguf(*period(2))), "WFWFWFW");
  EXPECT_EQ(kinds_of(ModelConfig::from_gguf(*period(1))), "FFFFFFF");
  EXPECT_EQ(kinds_of(ModelConfig::from_gguf(*period(0))), "WWWWWWW");  // 0: no global layer
  gguf::Array bools;
  for (bool b : {true, false, false, true, true, true, false}) bools.push_back(Value::boolean(b));
  const auto f = gemma_with(
      [&](gguf::Writer& w) { w.set(kPattern, Value::array(gguf::ValueType::BOOL, bools)); });
  const ModelConfig c = ModelConfig::from_gguf(*f);
  EXPECT_EQ(kinds_of(c), "WFFWWWF");
  EXPECT_EQ(c.n_swa, 32);
  EXPECT_EQ(c.n_layers_of(LayerKind::Window), 4);
}

TEST(Gemma3Config, NoWindowMeansGlobalLayers) {
  const auto f =
      gemma_with([](gguf::Writer& w) { w.set("gemma3.attention.sliding_window", Value::u32(0)); });
  const ModelConfig c = ModelConfig::from_gguf(*f);
  EXPECT_EQ(c.n_swa, 0);
  EXPECT_EQ(kinds_of(c), "FFFFFFF");
}

TEST(Gemma3Config, Refusals) {
  gguf::Array six;
  for (int i = 0; i < 6; ++i) six.push_back(Value::boolean(true));
  expect_refused(*gemma_with([&](gguf::Writer& w) {
    w.set(kPattern, Value::array(gguf::ValueType::BOOL, six));
  }),
                 {kPattern, "6 entries for 7 layers"});
  expect_refused(*gemma_with([](gguf::Writer& w) { w.set(kPattern, Value::i32(9)); }),
                 {kPattern, "9", "not a layer pattern"});
  expect_refused(*gemma_with([](gguf::Writer& w) { w.set(kPattern, Value::i32(-1)); }),
                 {kPattern, "not a layer pattern"});
  expect_refused(*gemma_with([](gguf::Writer& w) { w.set(kPattern, Value::str("sliding")); }),
                 {kPattern, "expected an integer"});
  gguf::Array ints;
  for (int i = 0; i < 7; ++i) ints.push_back(Value::i32(1));
  expect_refused(*gemma_with([&](gguf::Writer& w) {
    w.set(kPattern, Value::array(gguf::ValueType::I32, ints));
  }),
                 {kPattern, "expected a bool"});
  expect_refused(*gemma_with([](gguf::Writer& w) {
    w.set("gemma3.attention.sliding_window", Value::u32(4097));
  }),
                 {"gemma3.attention.sliding_window", "4097", "context_length 4096"});
  expect_refused(*gemma_with([](gguf::Writer& w) {
    w.set("gemma3.final_logit_softcapping", Value::f32(30.0f));
  }),
                 {"final_logit_softcapping"});
  expect_refused(
      *gemma_with([](gguf::Writer& w) { w.set("gemma3.rope.scaling.type", Value::str("yarn")); }),
      {"yarn", "not supported"});
  std::vector<std::string> norms;
  for (int il = 0; il < 7; ++il) {
    norms.push_back("blk." + std::to_string(il) + ".attn_q_norm.weight");
    norms.push_back("blk." + std::to_string(il) + ".attn_k_norm.weight");
  }
  expect_refused(*gemma_with([](gguf::Writer&) {}, norms), {"attn_q_norm"});
}

}  // namespace
}  // namespace kvs
