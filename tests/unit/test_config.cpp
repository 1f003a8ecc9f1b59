// ModelConfig::from_gguf on gemma3 and qwen35 files: the layer kinds from each form of the
// window pattern and of the hybrid's layer map, and the metadata (and for qwen35 the tensors)
// refused, each refusal naming the key or tensor. The files are tiny-gemma3 and tiny-qwen35
// with one key changed or tensors left out.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "kvs/gguf/gguf.h"
#include "kvs/model/config.h"
#include "kvs/model/synthetic.h"
#include "kvs/model/weights.h"
#include "kvs/util/error.h"

namespace kvs {
namespace {

using gguf::Value;
const std::string kPattern = "gemma3.attention.sliding_window_pattern";

// `base` with `edit` applied to its writer; tensors named in `drop` are left out.
std::unique_ptr<gguf::File> edited(const gguf::File& base,
                                   const std::function<void(gguf::Writer&)>& edit,
                                   const std::vector<std::string>& drop) {
  gguf::Writer w;
  for (const auto& [k, v] : base.metadata()) w.set(k, v);
  for (const auto& t : base.tensors()) {
    bool skip = false;
    for (const std::string& d : drop) skip |= t.name == d;
    if (!skip) w.add_tensor(t.name, t.type, t.dims, t.data, t.nbytes);
  }
  edit(w);
  return gguf::File::from_buffer(w.to_bytes(), "edited.gguf");
}

// tiny-gemma3 (7 layers, window 32, context 4096), edited.
std::unique_ptr<gguf::File> gemma_with(const std::function<void(gguf::Writer&)>& edit,
                                       const std::vector<std::string>& drop = {}) {
  static const std::unique_ptr<gguf::File> base = make_synthetic("tiny-gemma3");
  return edited(*base, edit, drop);
}

// tiny-qwen35 (8 layers, full attention every 4th, one MTP block), edited.
std::unique_ptr<gguf::File> qwen35_with(const std::function<void(gguf::Writer&)>& edit,
                                        const std::vector<std::string>& drop = {}) {
  static const std::unique_ptr<gguf::File> base = make_synthetic("tiny-qwen35");
  return edited(*base, edit, drop);
}

std::string kinds_of(const ModelConfig& c) {
  std::string s;
  for (LayerKind k : c.kinds) s += "FWR"[static_cast<int>(k)];
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

TEST(Qwen35Config, LayerMapAndWeights) {
  const auto f = qwen35_with([](gguf::Writer&) {});
  const ModelConfig c = ModelConfig::from_gguf(*f);
  EXPECT_EQ(kinds_of(c), "RRRFRRRF");
  EXPECT_EQ(c.kinds, synthetic_config("tiny-qwen35").kinds);
  EXPECT_EQ(c.n_nextn, 1);
  EXPECT_TRUE(c.attn_gate && c.qk_norm);
  EXPECT_EQ(c.rope_mode, RopeMode::Neox);
  EXPECT_EQ(c.rope_dim, 16);
  EXPECT_EQ(c.ssm_conv_dim(), 2 * 2 * 32 + 4 * 32);
  const Weights ws = Weights::from_gguf(*f, c);
  EXPECT_EQ(ws.layers[0].ssm_qkv.n_out, c.ssm_conv_dim());
  EXPECT_EQ(ws.layers[0].ssm_conv1d.size(), static_cast<size_t>(c.ssm_conv_dim() * c.ssm_conv));
  for (float a : ws.layers[0].ssm_a) EXPECT_LT(a, 0.0f);
  EXPECT_EQ(ws.layers[0].wq.n_out, 0);
  EXPECT_EQ(ws.layers[3].wq.n_out, 2 * c.q_dim());  // per head [q, gate]
  EXPECT_EQ(ws.layers[3].ssm_qkv.n_out, 0);
  EXPECT_EQ(ws.layers[3].ffn_norm.size(), static_cast<size_t>(c.n_embd));
  ASSERT_EQ(ws.nextn.size(), 1u);
  EXPECT_EQ(ws.nextn[0].eh_proj.n_in, 2 * c.n_embd);
  EXPECT_EQ(ws.nextn[0].block.wq.n_out, 2 * c.q_dim());
  EXPECT_EQ(ws.nextn[0].embed_tokens.n_out, 0);  // shares the trunk's
  EXPECT_EQ(ws.matrix_bytes(),
            Weights::from_gguf(*synthetic_shapes("tiny-qwen35"), c).matrix_bytes());

  auto interval = [](uint32_t n) {
    return qwen35_with(
        [n](gguf::Writer& w) { w.set("qwen35.full_attention_interval", Value::u32(n)); });
  };
  EXPECT_EQ(kinds_of(ModelConfig::from_gguf(*interval(2))), "RFRFRFRF");
  EXPECT_EQ(kinds_of(ModelConfig::from_gguf(*interval(1))), "FFFFFFFF");
  gguf::Array recurrent;  // one per block, the MTP block's included
  for (bool b : {true, false, false, true, true, true, true, false, false})
    recurrent.push_back(Value::boolean(b));
  EXPECT_EQ(kinds_of(ModelConfig::from_gguf(*qwen35_with([&](gguf::Writer& w) {
              w.set("qwen35.attention.recurrent_layers",
                    Value::array(gguf::ValueType::BOOL, recurrent));
            }))),
            "RFFRRRRF");
  // Without MTP blocks nothing of them is needed.
  const auto trunk = qwen35_with(
      [](gguf::Writer& w) {
        w.set("qwen35.block_count", Value::u32(8));
        w.set("qwen35.nextn_predict_layers", Value::u32(0));
      },
      {"blk.8.nextn.eh_proj.weight", "blk.8.nextn.enorm.weight", "blk.8.nextn.hnorm.weight"});
  const ModelConfig t = ModelConfig::from_gguf(*trunk);
  EXPECT_EQ(t.n_layer, 8);
  EXPECT_TRUE(Weights::from_gguf(*trunk, t).nextn.empty());
}

TEST(Qwen35Config, Refusals) {
  expect_refused(
      *qwen35_with([](gguf::Writer& w) { w.set("qwen35.full_attention_interval", Value::u32(3)); }),
      {"qwen35.full_attention_interval = 3", "does not divide the 8 layers"});
  expect_refused(
      *qwen35_with([](gguf::Writer& w) { w.set("qwen35.full_attention_interval", Value::u32(0)); }),
      {"qwen35.full_attention_interval = 0"});
  gguf::Array eight;
  for (int i = 0; i < 8; ++i) eight.push_back(Value::boolean(true));
  expect_refused(*qwen35_with([&](gguf::Writer& w) {
    w.set("qwen35.attention.recurrent_layers", Value::array(gguf::ValueType::BOOL, eight));
  }),
                 {"recurrent_layers", "8 entries for 9 blocks"});
  expect_refused(
      *qwen35_with([](gguf::Writer& w) { w.set("qwen35.ssm.time_step_rank", Value::u32(3)); }),
      {"qwen35.ssm.time_step_rank (value heads) 3", "group_count (key heads) 2"});
  expect_refused(
      *qwen35_with([](gguf::Writer& w) { w.set("qwen35.ssm.inner_size", Value::u32(100)); }),
      {"qwen35.ssm.inner_size 100"});
  expect_refused(
      *qwen35_with([](gguf::Writer& w) { w.set("qwen35.ssm.group_count", Value::u32(0)); }),
      {"qwen35.ssm.group_count = 0"});
  expect_refused(
      *qwen35_with([](gguf::Writer& w) { w.set("qwen35.nextn_predict_layers", Value::u32(9)); }),
      {"nextn_predict_layers = 9"});
  gguf::Array sections;  // 8 pairs: sector 3 is on neither t (3 < 3 fails), h nor w
  for (int32_t n : {1, 1, 2, 0}) sections.push_back(Value::i32(n));
  expect_refused(*qwen35_with([&](gguf::Writer& w) {
    w.set("qwen35.rope.dimension_sections", Value::array(gguf::ValueType::I32, sections));
  }),
                 {"dimension_sections", "rope pair 3"});
  // Tensors: each missing one refused by name before anything is allocated.
  for (const char* name :
       {"blk.1.ssm_alpha.weight", "blk.2.ssm_conv1d.weight", "blk.0.ssm_a", "blk.5.ssm_dt.bias",
        "blk.7.attn_q_norm.weight", "blk.8.nextn.eh_proj.weight"}) {
    const auto f = qwen35_with([](gguf::Writer&) {}, {name});
    const ModelConfig c = ModelConfig::from_gguf(*f);
    try {
      Weights::from_gguf(*f, c);
      ADD_FAILURE() << name << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace kvs
