// Synthetic models: preset shapes, determinism, loading, and a read back by the Python gguf
// package.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common.h"
#include "kvs/gguf/gguf.h"
#include "kvs/model/config.h"
#include "kvs/model/synthetic.h"
#include "kvs/model/weights.h"
#include "kvs/quant/types.h"
#include "kvs/tokenizer/tokenizer.h"
#include "kvs/util/error.h"

namespace kvs {
namespace {

struct Expected {
  const char* preset;
  Arch arch;
  int32_t n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, n_vocab;
  float rope_base, eps;
  RopeMode rope;
  bool bias, qk_norm, tied;
  int32_t n_swa = 0;  // gemma3
  float linear_scale = 1.0f;
  int32_t rope_dim = 0;  // qwen35's rotated dims (0: head_dim)
  int32_t full_interval = 4;  // qwen35: every n-th layer full attention
};

const Expected kExpected[] = {
    {"tiny", Arch::Llama, 2, 128, 384, 4, 2, 32, 512, 10000.0f, 1e-5f, RopeMode::Norm, false, false,
     false},
    {"tiny-qwen2", Arch::Qwen2, 2, 128, 384, 4, 2, 32, 512, 1e6f, 1e-6f, RopeMode::Neox, true,
     false, true},
    {"tiny-qwen3", Arch::Qwen3, 2, 128, 384, 4, 2, 64, 512, 1e6f, 1e-6f, RopeMode::Neox, false,
     true, false},
    {"tiny-h128", Arch::Llama, 2, 256, 512, 4, 1, 128, 512, 500000.0f, 1e-5f, RopeMode::Norm, false,
     false, false},
    {"smollm2-135m", Arch::Llama, 30, 576, 1536, 9, 3, 64, 49152, 100000.0f, 1e-5f, RopeMode::Norm,
     false, false, true},
    {"llama3-8b", Arch::Llama, 32, 4096, 14336, 32, 8, 128, 128256, 500000.0f, 1e-5f,
     RopeMode::Norm, false, false, false},
    {"qwen3-8b", Arch::Qwen3, 36, 4096, 12288, 32, 8, 128, 151936, 1e6f, 1e-6f, RopeMode::Neox,
     false, true, false},
    {"qwen2-0.5b", Arch::Qwen2, 24, 896, 4864, 14, 2, 64, 151936, 1e6f, 1e-6f, RopeMode::Neox, true,
     false, true},
    {"tiny-gemma3", Arch::Gemma3, 7, 128, 384, 4, 1, 64, 512, 1e6f, 1e-6f, RopeMode::Neox, false,
     true, true, 32, 8.0f},
    {"gemma3-270m", Arch::Gemma3, 18, 640, 2048, 4, 1, 256, 262144, 1e6f, 1e-6f, RopeMode::Neox,
     false, true, true, 512},
    {"gemma3-27b", Arch::Gemma3, 62, 5376, 21504, 32, 16, 128, 262208, 1e6f, 1e-6f, RopeMode::Neox,
     false, true, true, 1024, 8.0f},
    {"tiny-qwen35", Arch::Qwen35, 8, 128, 384, 4, 1, 64, 512, 1e7f, 1e-6f, RopeMode::Neox, false,
     true, false, 0, 1.0f, 16},
    {"tiny-qwen35-gdn", Arch::Qwen35, 8, 128, 384, 4, 1, 64, 512, 1e7f, 1e-6f, RopeMode::Neox,
     false, true, false, 0, 1.0f, 16, 8},
    {"qwen35-mini", Arch::Qwen35, 4, 256, 512, 2, 1, 256, 512, 1e7f, 1e-6f, RopeMode::Neox, false,
     true, false, 0, 1.0f, 64},
    {"qwen35-27b", Arch::Qwen35, 64, 5120, 17408, 24, 4, 256, 248320, 1e7f, 1e-6f, RopeMode::Neox,
     false, true, false, 0, 1.0f, 64},
    {"qwen35-9b", Arch::Qwen35, 32, 4096, 12288, 16, 4, 256, 248320, 1e7f, 1e-6f, RopeMode::Neox,
     false, true, false, 0, 1.0f, 64},
};

void expect_shape(const ModelConfig& c, const Expected& e) {
  SCOPED_TRACE(e.preset);
  EXPECT_EQ(c.arch, e.arch);
  EXPECT_EQ(c.arch_name, arch_name(e.arch));
  EXPECT_EQ(c.n_layer, e.n_layer);
  EXPECT_EQ(c.n_embd, e.n_embd);
  EXPECT_EQ(c.n_ff, e.n_ff);
  EXPECT_EQ(c.n_head, e.n_head);
  EXPECT_EQ(c.n_head_kv, e.n_head_kv);
  EXPECT_EQ(c.head_dim, e.head_dim);
  EXPECT_EQ(c.rope_dim, e.rope_dim > 0 ? e.rope_dim : e.head_dim);
  EXPECT_EQ(c.n_vocab, e.n_vocab);
  EXPECT_FLOAT_EQ(c.rope_base, e.rope_base);
  EXPECT_FLOAT_EQ(c.norm_eps, e.eps);
  EXPECT_EQ(c.rope_mode, e.rope);
  EXPECT_EQ(c.qkv_bias, e.bias);
  EXPECT_EQ(c.qk_norm, e.qk_norm);
  EXPECT_EQ(c.tied_embeddings, e.tied);
  EXPECT_FALSE(c.has_rope_freqs);
  EXPECT_FLOAT_EQ(c.rope_linear_scale, e.linear_scale);
  EXPECT_EQ(c.n_swa, e.n_swa);
  ASSERT_EQ(c.kinds.size(), static_cast<size_t>(e.n_layer));
  const bool gemma = e.arch == Arch::Gemma3, qwen35 = e.arch == Arch::Qwen35;
  // Gemma 3's period of 6: layers 5, 11, 17, ... global, the rest windowed; Qwen3.5's interval
  // of 4 (or the preset's): layers 3, 7, 11, ... full attention, the rest Gated DeltaNet.
  for (int32_t il = 0; il < e.n_layer; ++il) {
    LayerKind want = LayerKind::Full;
    if (gemma && il % 6 != 5) want = LayerKind::Window;
    if (qwen35 && (il + 1) % e.full_interval != 0) want = LayerKind::Recurrent;
    EXPECT_EQ(c.kinds[static_cast<size_t>(il)], want) << "layer " << il;
  }
  EXPECT_EQ(c.attn_gate, qwen35);
  EXPECT_EQ(c.n_nextn, qwen35 ? 1 : 0);
  EXPECT_FLOAT_EQ(c.rope_base_swa, 10000.0f);
  EXPECT_EQ(c.act, gemma ? Activation::GeluTanh : Activation::SiLU);
  EXPECT_EQ(c.post_norms, gemma);
  EXPECT_FLOAT_EQ(c.embd_scale, gemma ? std::sqrt(static_cast<float>(e.n_embd)) : 1.0f);
  // The 27B's query_pre_attn_scalar is 168 = n_embd / n_head, not its head size.
  const float scale_dim = e.n_layer == 62 && gemma ? 168.0f : static_cast<float>(e.head_dim);
  EXPECT_FLOAT_EQ(c.attn_scale, 1.0f / std::sqrt(scale_dim));
}

const Expected& expected(std::string_view preset) {
  for (const Expected& e : kExpected)
    if (preset == e.preset) return e;
  throw Error("no expectation for " + std::string(preset));
}

TEST(Synthetic, PresetList) {
  std::vector<std::string> names;
  for (const Expected& e : kExpected) names.emplace_back(e.preset);
  EXPECT_EQ(synthetic_presets(), names);
}

TEST(Synthetic, EveryPresetConfig) {
  for (const Expected& e : kExpected) expect_shape(synthetic_config(e.preset), e);
  EXPECT_EQ(synthetic_config("qwen3-8b").q_dim(), 4096);
  EXPECT_EQ(synthetic_config("tiny-qwen3").q_dim(), 256);
  EXPECT_EQ(synthetic_config("llama3-8b:q4_0").kv_dim(), 1024);
  EXPECT_EQ(synthetic_config("gemma3-270m").q_dim(), 1024);
  EXPECT_EQ(synthetic_config("gemma3-27b").n_layers_of(LayerKind::Full), 10);
  EXPECT_EQ(synthetic_config("gemma3-27b").n_layers_of(LayerKind::Window), 52);
  // Qwen3.5 27B: 16 of 64 layers keep K/V (4 heads of 256); 48 GDN layers of 16 key heads read
  // by 48 value heads of 128.
  const ModelConfig q = synthetic_config("qwen35-27b:iq4_xs");
  EXPECT_EQ(q.n_layers_of(LayerKind::Full), 16);
  EXPECT_EQ(q.n_layers_of(LayerKind::Recurrent), 48);
  EXPECT_EQ(q.kv_dim(), 1024);
  EXPECT_EQ(q.ssm_conv_dim(), 2 * 16 * 128 + 48 * 128);
  EXPECT_EQ(q.ssm_value_dim(), 6144);
  EXPECT_EQ(q.ssm_conv, 4);
  EXPECT_EQ(synthetic_config("qwen35-9b").ssm_v_heads, 32);
  EXPECT_EQ(synthetic_config("tiny-qwen35-gdn").n_layers_of(LayerKind::Full), 1);
  EXPECT_EQ(synthetic_config("qwen35-mini").ssm_v_heads, 3);
}

// The hybrid built and read back: the config, the weights of both layer kinds and of the MTP
// block, the sizes, and the metadata keys as llama.cpp's qwen35 loader reads them.
TEST(Synthetic, Qwen35BuildsAndLoads) {
  for (const char* spec : {"tiny-qwen35", "tiny-qwen35:q4_0", "tiny-qwen35:f32"}) {
    SCOPED_TRACE(spec);
    std::unique_ptr<gguf::File> f = make_synthetic(spec);
    const ModelConfig c = ModelConfig::from_gguf(*f);
    expect_shape(c, expected("tiny-qwen35"));
    const ModelConfig s = synthetic_config(spec);
    EXPECT_EQ(c.kinds, s.kinds);
    EXPECT_EQ(c.ssm_conv_dim(), s.ssm_conv_dim());
    EXPECT_EQ(c.ssm_v_heads, s.ssm_v_heads);
    EXPECT_EQ(c.ssm_state, s.ssm_state);
    EXPECT_EQ(c.ssm_conv, s.ssm_conv);
    const Weights w = Weights::from_gguf(*f, c);
    EXPECT_EQ(w.matrix_bytes(), Weights::from_gguf(*synthetic_shapes(spec), c).matrix_bytes());
    EXPECT_EQ(w.nextn.size(), 1u);
    EXPECT_EQ(f->get_int("qwen35.block_count"), 9);
    EXPECT_EQ(f->get_int("qwen35.full_attention_interval"), 4);
    EXPECT_EQ(f->get_int("qwen35.rope.dimension_count"), 16);
    const gguf::Array& sec = f->get("qwen35.rope.dimension_sections").as_array("sections");
    ASSERT_EQ(sec.size(), 4u);
    EXPECT_EQ(sec[0].as_int("s") + sec[1].as_int("s") + sec[2].as_int("s"), 8);
    EXPECT_EQ(f->tensor("blk.0.ssm_conv1d.weight").dims, (std::vector<int64_t>{4, 256}));
    EXPECT_EQ(f->find_tensor("blk.0.attn_q.weight"), nullptr);
    EXPECT_EQ(f->find_tensor("blk.3.ffn_norm.weight"), nullptr);
  }
  // The 27B's sizes without building it: its matrices at iq4_xs near 15 GiB.
  const auto big = synthetic_shapes("qwen35-27b:iq4_xs");
  const double gib = static_cast<double>(
                         Weights::from_gguf(*big, ModelConfig::from_gguf(*big)).matrix_bytes()) /
                     (1 << 30);
  EXPECT_GT(gib, 12.0);
  EXPECT_LT(gib, 16.0);
}

// Builds the model, then checks the config read back, the weights, the tokenizer.
void check_built(const std::string& spec, DType want_type) {
  SCOPED_TRACE(spec);
  std::unique_ptr<gguf::File> f = make_synthetic(spec);
  EXPECT_EQ(f->name(), "synthetic:" + spec);
  EXPECT_EQ(f->alignment(), 32u);
  const ModelConfig c = ModelConfig::from_gguf(*f);
  const std::string preset = spec.substr(0, spec.find(':'));
  expect_shape(c, expected(preset));
  const ModelConfig s = synthetic_config(spec);
  EXPECT_EQ(c.name, s.name);
  EXPECT_EQ(c.n_ctx_train, s.n_ctx_train);
  expect_shape(s, expected(preset));

  const Weights w = Weights::from_gguf(*f, c);
  ASSERT_EQ(w.layers.size(), static_cast<size_t>(c.n_layer));
  EXPECT_EQ(w.layers[0].wq.type, want_type);
  EXPECT_EQ(w.layers[0].down.type, want_type);
  EXPECT_EQ(f->tensor("output_norm.weight").type, DType::F32);
  EXPECT_EQ(f->tensor("blk.0.attn_norm.weight").type, DType::F32);
  size_t expect_tensors =
      2 + (c.tied_embeddings ? 0 : 1) +
      static_cast<size_t>(c.n_layer) *
          (9 + (c.qkv_bias ? 3 : 0) + (c.qk_norm ? 2 : 0) + (c.post_norms ? 2 : 0));
  EXPECT_EQ(f->tensors().size(), expect_tensors);
  // Norm weights near 1 (a GGUF gemma norm already holds Gemma's 1 + w).
  for (const Vec* v : {&w.layers[0].attn_norm, &w.layers[0].q_norm, &w.layers[0].attn_post_norm,
                       &w.layers[c.n_layer - 1].ffn_post_norm}) {
    for (float x : *v) {
      EXPECT_GE(x, 0.8f);
      EXPECT_LE(x, 1.2f);
    }
  }
  EXPECT_EQ(w.layers[0].attn_post_norm.size(), c.post_norms ? static_cast<size_t>(c.n_embd) : 0u);
  EXPECT_EQ(w.layers[0].ffn_post_norm.size(), c.post_norms ? static_cast<size_t>(c.n_embd) : 0u);
  for (float x : w.layers[1].bq) EXPECT_LE(std::fabs(x), 0.1f);
  // Matrix values stay within their uniform bound (plus quantization error).
  std::vector<float> row(static_cast<size_t>(c.n_embd));
  dequantize_row(w.layers[0].wq.type, w.layers[0].wq.row(1), row.data(), c.n_embd);
  const float bound = std::sqrt(3.0f / static_cast<float>(c.n_embd)) * 1.2f;
  float amax = 0;
  for (float x : row) {
    ASSERT_TRUE(std::isfinite(x));
    amax = std::max(amax, std::fabs(x));
  }
  EXPECT_LE(amax, bound);
  EXPECT_GT(amax, bound * 0.3f);

  std::unique_ptr<Tokenizer> t = Tokenizer::from_gguf(*f);
  EXPECT_EQ(t->n_vocab(), c.n_vocab);
  const std::string text = "Hello world, the quick brown fox.";
  EXPECT_EQ(t->decode(t->encode(text, false, false)), text);
  EXPECT_FALSE(t->add_bos());
}

TEST(Synthetic, TinyPresetsBuildAndLoad) {
  check_built("tiny", DType::Q8_0);
  check_built("tiny-qwen2", DType::Q8_0);
  check_built("tiny-qwen3:f16", DType::F16);
  check_built("tiny-gemma3", DType::Q8_0);
  // Gemma 3 270M's full size: n_embd 640 is not a multiple of 256, so q4_k rows of 640 fall back
  // to q5_0 as in llama.cpp, while ffn_down's rows of 2048 keep q4_k.
  std::unique_ptr<gguf::File> f = make_synthetic("gemma3-270m:q4_k");
  EXPECT_EQ(f->tensor("blk.0.attn_q.weight").type, DType::Q5_0);
  EXPECT_EQ(f->tensor("blk.0.attn_output.weight").type, DType::Q4_K);
  EXPECT_EQ(f->tensor("blk.17.ffn_down.weight").type, DType::Q4_K);
  EXPECT_EQ(f->get_int("gemma3.attention.sliding_window"), 512);
  const ModelConfig c = ModelConfig::from_gguf(*f);
  expect_shape(c, expected("gemma3-270m"));
  EXPECT_EQ(Weights::from_gguf(*f, c).matrix_bytes(),
            Weights::from_gguf(*synthetic_shapes("gemma3-270m:q4_k"), c).matrix_bytes());
}

// synthetic_shapes: the model's tensors, same names, types, shapes and offsets, and its config;
// the matrices zero.
TEST(Synthetic, ShapesAreTheModelsWithoutItsValues) {
  for (const char* spec : {"tiny", "tiny-gemma3:q4_k", "tiny-qwen35:q4_k", "smollm2-135m:q4_1"}) {
    const auto f = make_synthetic(spec);
    const auto s = synthetic_shapes(spec);
    ASSERT_EQ(f->tensors().size(), s->tensors().size()) << spec;
    for (size_t i = 0; i < f->tensors().size(); ++i) {
      const gguf::TensorInfo &a = f->tensors()[i], &b = s->tensors()[i];
      EXPECT_EQ(a.name, b.name) << spec;
      EXPECT_EQ(a.type, b.type) << a.name;
      EXPECT_EQ(a.dims, b.dims) << a.name;
      EXPECT_EQ(a.offset, b.offset) << a.name;
    }
    const ModelConfig a = ModelConfig::from_gguf(*f), b = ModelConfig::from_gguf(*s);
    EXPECT_EQ(a.n_vocab, b.n_vocab) << spec;
    EXPECT_EQ(a.kinds, b.kinds) << spec;
    EXPECT_EQ(a.head_dim, b.head_dim) << spec;
    const gguf::TensorInfo& q = s->tensor("blk.0.ffn_up.weight");
    const size_t n = row_bytes(q.type, q.dims[0]) * static_cast<size_t>(q.rows());
    EXPECT_EQ(std::count(q.data, q.data + n, uint8_t{0}), static_cast<std::ptrdiff_t>(n)) << spec;
  }
}

TEST(Synthetic, SmolLM2Q4_0BuildsAndLoads) {
  check_built("smollm2-135m:q4_0", DType::Q4_0);
}

TEST(Synthetic, EveryWeightType) {
  for (const char* t : {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k",
                        "q5_k", "q6_k", "q2_k", "q3_k", "iq4_nl", "iq4_xs"}) {
    SCOPED_TRACE(t);
    std::unique_ptr<gguf::File> f = make_synthetic(std::string("tiny:") + t);
    const ModelConfig c = ModelConfig::from_gguf(*f);
    const Weights w = Weights::from_gguf(*f, c);
    const DType want = parse_dtype(t, "test");
    // n_embd 128 is not a multiple of the K-quants' 256: those rows fall back, as in llama.cpp;
    // ffn_down (n_in 384) neither. The general.file_type still says what was asked for.
    if (traits(want).block == 256) {
      EXPECT_NE(w.layers[0].wq.type, want);
    } else {
      EXPECT_EQ(w.layers[0].wq.type, want);
      EXPECT_EQ(w.layers[1].down.type, want);
      EXPECT_EQ(w.tok_embd.type, want);
    }
  }
  // A shape the K blocks divide keeps the K type.
  std::unique_ptr<gguf::File> f = make_synthetic("tiny-qwen3:q4_k");
  EXPECT_EQ(f->tensor("blk.0.attn_output.weight").type, DType::Q4_K);  // n_in = q_dim 256
  // q2_k, q3_k and iq4_xs fall back to iq4_nl, as in llama.cpp; tiny-h128's rows are all 256s.
  f = make_synthetic("tiny:iq4_xs");
  EXPECT_EQ(f->tensor("blk.0.attn_q.weight").type, DType::IQ4_NL);
  for (const DType t : {DType::Q2_K, DType::Q3_K, DType::IQ4_XS}) {
    f = make_synthetic(std::string("tiny-h128:") + dtype_name(t));
    EXPECT_EQ(f->tensor("blk.0.attn_q.weight").type, t);
    EXPECT_EQ(f->tensor("blk.1.ffn_down.weight").type, t);
  }
  // Every type on gemma3's shapes: rows of 128 (n_embd), 256 (q_dim) and 384 (n_ff), each
  // either kept or fallen back to a type whose blocks divide it; the sizes agree.
  for (const char* t : {"f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k",
                        "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs"}) {
    SCOPED_TRACE(t);
    const std::string spec = std::string("tiny-gemma3:") + t;
    f = make_synthetic(spec);
    const ModelConfig c = ModelConfig::from_gguf(*f);
    const Weights w = Weights::from_gguf(*f, c);
    EXPECT_EQ(w.layers[6].wo.type, parse_dtype(t, "test"));  // n_in 256
    EXPECT_EQ(w.matrix_bytes(), Weights::from_gguf(*synthetic_shapes(spec), c).matrix_bytes());
  }
}

TEST(Synthetic, Deterministic) {
  const std::vector<uint8_t> a = synthetic_writer("tiny").to_bytes();
  const std::vector<uint8_t> b = synthetic_writer("tiny:q8_0").to_bytes();
  EXPECT_EQ(a, b);
  EXPECT_NE(a, synthetic_writer("tiny:q4_0").to_bytes());
  const std::vector<uint8_t> q = synthetic_writer("tiny-qwen2:q4_0").to_bytes();
  EXPECT_EQ(q, synthetic_writer("tiny-qwen2:Q4_0").to_bytes());
  // Different tensors get different values.
  std::unique_ptr<gguf::File> f = make_synthetic("tiny:f32");
  const gguf::TensorInfo& k = f->tensor("blk.0.attn_k.weight");
  const gguf::TensorInfo& v = f->tensor("blk.0.attn_v.weight");
  ASSERT_EQ(k.nbytes, v.nbytes);
  EXPECT_NE(std::memcmp(k.data, v.data, k.nbytes), 0);
  // And different rows of one tensor.
  EXPECT_NE(std::memcmp(k.data, k.data + 128 * 4, 128 * 4), 0);
}

TEST(Synthetic, Metadata) {
  std::unique_ptr<gguf::File> f = make_synthetic("tiny-qwen3");
  EXPECT_EQ(f->get_string("general.architecture"), "qwen3");
  EXPECT_EQ(f->get_int("qwen3.attention.key_length"), 64);
  EXPECT_EQ(f->get_int("qwen3.attention.value_length"), 64);
  EXPECT_EQ(f->get_int("general.file_type"), 7);  // MOSTLY_Q8_0
  EXPECT_EQ(f->get_int("general.alignment"), 32);
  EXPECT_FALSE(f->get_bool("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(f->get("tokenizer.ggml.tokens").as_array("t").size(), 512u);
  EXPECT_EQ(f->get("tokenizer.ggml.token_type").elem, gguf::ValueType::I32);
  EXPECT_EQ(f->get("tokenizer.ggml.bos_token_id").type, gguf::ValueType::U32);
}

TEST(Synthetic, PythonGgufReadsIt) {
  const auto dir = test::temp_dir("synthetic");
  const std::string path = (dir / "tiny-qwen2.gguf").string();
  synthetic_writer("tiny-qwen2:q4_0").write(path);
  const size_t n_tensors = make_synthetic("tiny-qwen2:q4_0")->tensors().size();
  const std::string script =
      "import sys, gguf\n"
      "r = gguf.GGUFReader(sys.argv[1])\n"
      "f = r.fields['general.architecture']\n"
      "arch = bytes(f.parts[f.data[0]]).decode()\n"
      "f = r.fields['qwen2.block_count']\n"
      "layers = int(f.parts[f.data[0]][0])\n"
      "n = len(r.tensors)\n"
      "t = {x.name: x for x in r.tensors}\n"
      "ok = arch == 'qwen2' and layers == 2 and n == int(sys.argv[2]) and "
      "'blk.1.attn_q.bias' in t and 'output.weight' not in t and "
      "t['blk.0.attn_q.weight'].tensor_type == gguf.GGMLQuantizationType.Q4_0 and "
      "list(t['blk.0.attn_k.weight'].shape) == [128, 64]\n"
      "print(arch, layers, n)\n"
      "sys.exit(0 if ok else 1)\n";
  const std::string py = (dir / "check.py").string();
  {
    std::FILE* fp = std::fopen(py.c_str(), "w");
    ASSERT_NE(fp, nullptr);
    std::fputs(script.c_str(), fp);
    std::fclose(fp);
  }
  const std::string cmd =
      "'" + test::python() + "' '" + py + "' '" + path + "' " + std::to_string(n_tensors);
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::filesystem::remove_all(dir);
}

TEST(Synthetic, BadSpecErrors) {
  try {
    make_synthetic("nope:q4_0");
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("nope"), std::string::npos) << m;
    EXPECT_NE(m.find("llama3-8b"), std::string::npos) << m;
    EXPECT_NE(m.find("tiny-qwen3"), std::string::npos) << m;
  }
  try {
    make_synthetic("tiny:q9_9");
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("q9_9"), std::string::npos) << m;
    EXPECT_NE(m.find("q4_k"), std::string::npos) << m;
  }
  EXPECT_THROW(synthetic_config("llama4"), Error);
  EXPECT_THROW(synthetic_writer("tiny:iq2_xxs"), Error);
  EXPECT_THROW(synthetic_writer(""), Error);
  EXPECT_THROW(synthetic_writer("tiny-gemma3:q9_9"), Error);
}

// The gemma3 metadata the config reads, with the keys and types llama.cpp's loader expects.
TEST(Synthetic, Gemma3Metadata) {
  std::unique_ptr<gguf::File> f = make_synthetic("tiny-gemma3");
  EXPECT_EQ(f->get_string("general.architecture"), "gemma3");
  EXPECT_EQ(f->get("gemma3.attention.sliding_window").type, gguf::ValueType::U32);
  EXPECT_EQ(f->get_int("gemma3.attention.sliding_window"), 32);
  EXPECT_FLOAT_EQ(static_cast<float>(f->get_float("gemma3.rope.freq_base_swa")), 10000.0f);
  EXPECT_EQ(f->get_int("gemma3.attention.key_length"), 64);
  EXPECT_EQ(f->find("gemma3.attention.sliding_window_pattern"), nullptr);  // as published files
  EXPECT_EQ(f->get_string("gemma3.rope.scaling.type"), "linear");
  EXPECT_FLOAT_EQ(static_cast<float>(f->get_float("gemma3.rope.scaling.factor")), 8.0f);
  EXPECT_EQ(f->find_tensor("output.weight"), nullptr);  // tied
  for (const char* t : {"blk.6.post_attention_norm.weight", "blk.6.post_ffw_norm.weight",
                        "blk.6.attn_q_norm.weight", "blk.6.attn_k_norm.weight"})
    EXPECT_NE(f->find_tensor(t), nullptr) << t;
}

}  // namespace
}  // namespace kvs
