// Synthetic models: the shapes of real models, deterministic random weights, a synthetic
// byte-level BPE vocabulary, all written through gguf::Writer.
#include "kvs/model/synthetic.h"

#include <algorithm>
#include <cmath>

#include "kvs/gguf/gguf.h"
#include "kvs/model/config.h"
#include "kvs/quant/types.h"
#include "kvs/tokenizer/tokenizer.h"
#include "kvs/util/error.h"
#include "kvs/util/threadpool.h"

namespace kvs {
namespace {

struct Preset {
  const char* name;
  Arch arch;
  const char* display;  // general.name
  int32_t n_layer, n_embd, n_ff, n_head, n_head_kv;
  int32_t head_dim;  // 0: n_embd / n_head (no key_length written)
  int32_t n_vocab, n_ctx;
  float eps, rope_base;
  bool bias, qk_norm, tied;
  // gemma3: the sliding window (every gemma3 preset has one), its layers' rope base, and the
  // global layers' linear rope scaling. Window layers follow the published period of 6
  // (layers 5, 11, ... global), so no pattern key is written, as in the published files.
  int32_t n_swa = 0;
  float rope_base_swa = 10000.0f, rope_linear_scale = 1.0f;
  // qwen35: the Gated DeltaNet's key heads, value heads, head size and conv taps; every
  // full_interval-th layer full attention, the rest GDN; the rotated dims; the MTP blocks.
  int32_t ssm_k_heads = 0, ssm_v_heads = 0, ssm_state = 0, ssm_conv = 0;
  int32_t full_interval = 0, rope_dim = 0, n_nextn = 0;
};

// A qwen35 preset: p with the Gated DeltaNet's key heads, value heads and head size, and the
// rotated dims; every Qwen3.5 has conv kernels of 4, full attention every 4th layer and one MTP
// block.
constexpr Preset qwen35(Preset p, int32_t k_heads, int32_t v_heads, int32_t state,
                        int32_t rope_dim, int32_t full_interval = 4) {
  p.ssm_k_heads = k_heads, p.ssm_v_heads = v_heads, p.ssm_state = state, p.ssm_conv = 4;
  p.full_interval = full_interval, p.rope_dim = rope_dim, p.n_nextn = 1;
  return p;
}

// Shapes as in the real models' config.json / GGUF conversions.
constexpr Preset kPresets[] = {
    {"tiny", Arch::Llama, "Synthetic Tiny Llama", 2, 128, 384, 4, 2, 0, 512, 4096, 1e-5f, 10000.0f,
     false, false, false},
    {"tiny-qwen2", Arch::Qwen2, "Synthetic Tiny Qwen2", 2, 128, 384, 4, 2, 0, 512, 4096, 1e-6f,
     1000000.0f, true, false, true},
    {"tiny-qwen3", Arch::Qwen3, "Synthetic Tiny Qwen3", 2, 128, 384, 4, 2, 64, 512, 4096, 1e-6f,
     1000000.0f, false, true, false},
    // The 8B models' head size (128) and group (4 heads a kv head) at a tiny size.
    {"tiny-h128", Arch::Llama, "Synthetic Tiny Llama, heads of 128", 2, 256, 512, 4, 1, 128, 512,
     4096, 1e-5f, 500000.0f, false, false, false},
    {"smollm2-135m", Arch::Llama, "SmolLM2 135M (synthetic)", 30, 576, 1536, 9, 3, 0, 49152, 8192,
     1e-5f, 100000.0f, false, false, true},
    {"llama3-8b", Arch::Llama, "Llama 3 8B (synthetic)", 32, 4096, 14336, 32, 8, 0, 128256, 8192,
     1e-5f, 500000.0f, false, false, false},
    {"qwen3-8b", Arch::Qwen3, "Qwen3 8B (synthetic)", 36, 4096, 12288, 32, 8, 128, 151936, 40960,
     1e-6f, 1000000.0f, false, true, false},
    {"qwen2-0.5b", Arch::Qwen2, "Qwen2 0.5B (synthetic)", 24, 896, 4864, 14, 2, 0, 151936, 32768,
     1e-6f, 1000000.0f, true, false, true},
    // Gemma 3's layer kinds at a tiny size: 7 layers (window layers on both sides of global
    // layer 5), a window of 32, heads of 64 whose q_dim (256) is not n_embd, one KV head, and
    // the larger models' linear rope scaling of 8, which only the global layers apply.
    {"tiny-gemma3", Arch::Gemma3, "Synthetic Tiny Gemma 3", 7, 128, 384, 4, 1, 64, 512, 4096, 1e-6f,
     1000000.0f, false, true, true, 32, 10000.0f, 8.0f},
    // google/gemma-3-270m config.json: hidden_size 640, intermediate_size 2048, 18 layers, 4
    // heads, 1 KV head, head_dim 256, vocab 262144, sliding_window 512, rope_theta 1e6,
    // rope_local_base_freq 1e4, rms_norm_eps 1e-6, max_position_embeddings 32768, tied.
    {"gemma3-270m", Arch::Gemma3, "Gemma 3 270M (synthetic)", 18, 640, 2048, 4, 1, 256, 262144,
     32768, 1e-6f, 1000000.0f, false, true, true, 512},
    // google/gemma-3-27b-it config.json, text_config: hidden_size 5376, intermediate_size 21504,
    // 62 layers, 32 heads, 16 KV heads, head_dim 128, vocab_size 262208, sliding_window 1024,
    // rope_theta 1e6 with rope_scaling linear 8, rope_local_base_freq 1e4, rms_norm_eps 1e-6,
    // 128k context; query_pre_attn_scalar 168 (ModelConfig knows it by the layer count).
    {"gemma3-27b", Arch::Gemma3, "Gemma 3 27B (synthetic)", 62, 5376, 21504, 32, 16, 128, 262208,
     131072, 1e-6f, 1000000.0f, false, true, true, 1024, 10000.0f, 8.0f},
    // Qwen3.5's hybrid at a tiny size: 8 layers (full attention at 3 and 7), 2 GDN key heads
    // read by 4 value heads (the 27B's 3:1 is 16:48), heads of 32, a quarter of the attention
    // head rotated, and one MTP block.
    qwen35({"tiny-qwen35", Arch::Qwen35, "Synthetic Tiny Qwen3.5", 8, 128, 384, 4, 1, 64, 512, 4096,
            1e-6f, 10000000.0f, false, true, false},
           2, 4, 32, 16),
    // The same with one full-attention layer of 8, where the Gated DeltaNet decides the logits.
    qwen35({"tiny-qwen35-gdn", Arch::Qwen35, "Synthetic Tiny Qwen3.5, mostly GDN", 8, 128, 384,
            4, 1, 64, 512, 4096, 1e-6f, 10000000.0f, false, true, false},
           2, 4, 32, 16, 8),
    // The 27B's head sizes (attention 256, GDN 128, 64 rotated) and 3 value heads a key head, in
    // rows of 256 that take K-quants: 4 layers, one of them full attention.
    qwen35({"qwen35-mini", Arch::Qwen35, "Synthetic Qwen3.5, the 27B's heads", 4, 256, 512, 2, 1,
            256, 512, 4096, 1e-6f, 10000000.0f, false, true, false},
           1, 3, 128, 64),
    // Qwen/Qwen3.5-27B config.json, text_config: hidden_size 5120, intermediate_size 17408, 64
    // layers, full_attention_interval 4, 24 heads, 4 KV heads, head_dim 256,
    // partial_rotary_factor 0.25, rope_theta 1e7, mrope_section [11, 11, 10], linear (GDN)
    // 16 key heads, 48 value heads, head dims 128, conv kernel 4, vocab 248320,
    // rms_norm_eps 1e-6, max_position_embeddings 262144, untied, mtp_num_hidden_layers 1.
    qwen35({"qwen35-27b", Arch::Qwen35, "Qwen3.5 27B (synthetic)", 64, 5120, 17408, 24, 4, 256,
            248320, 262144, 1e-6f, 10000000.0f, false, true, false},
           16, 48, 128, 64),
    // Qwen/Qwen3.5-9B config.json, text_config: hidden_size 4096, intermediate_size 12288, 32
    // layers, 16 heads, 4 KV heads, head_dim 256, linear 16 key heads, 32 value heads; the rest
    // as the 27B.
    qwen35({"qwen35-9b", Arch::Qwen35, "Qwen3.5 9B (synthetic)", 32, 4096, 12288, 16, 4, 256,
            248320, 262144, 1e-6f, 10000000.0f, false, true, false},
           16, 32, 128, 64),
};

// A gemma3 preset has a window that fits its context (ModelConfig refuses a larger one, and
// without one every layer would be global); the others have none.
constexpr bool windows_fit() {
  for (const Preset& p : kPresets) {
    const bool gemma = p.arch == Arch::Gemma3;
    if (gemma ? p.n_swa <= 0 || p.n_swa > p.n_ctx : p.n_swa != 0) return false;
  }
  return true;
}
static_assert(windows_fit(), "a preset's sliding window is 0, or larger than its context");

// A qwen35 preset's GDN heads fit (value heads a multiple of key heads), its interval divides
// its layers, and its rotated dims fit the head; the others have none of these.
constexpr bool hybrids_fit() {
  for (const Preset& p : kPresets) {
    if (p.arch != Arch::Qwen35) {
      if (p.ssm_k_heads != 0 || p.full_interval != 0 || p.rope_dim != 0 || p.n_nextn != 0)
        return false;
    } else if (p.ssm_k_heads <= 0 || p.ssm_v_heads % p.ssm_k_heads != 0 || p.ssm_state <= 0 ||
               p.ssm_conv < 2 || p.full_interval <= 0 || p.n_layer % p.full_interval != 0 ||
               p.rope_dim <= 0 || p.rope_dim > p.head_dim || p.rope_dim % 2 != 0) {
      return false;
    }
  }
  return true;
}
static_assert(hybrids_fit(), "a qwen35 preset's GDN heads, interval or rope dims do not fit");

// Window layers as llama.cpp's default period of 6 lays them out: global where il % 6 == 5;
// qwen35's GDN layers as its full_attention_interval does: full where (il + 1) % n == 0.
std::vector<LayerKind> preset_kinds(const Preset& p) {
  std::vector<LayerKind> k(static_cast<size_t>(p.n_layer), LayerKind::Full);
  for (int32_t il = 0; il < p.n_layer; ++il) {
    if (p.n_swa > 0 && il % 6 < 5) k[static_cast<size_t>(il)] = LayerKind::Window;
    if (p.full_interval > 0 && (il + 1) % p.full_interval != 0)
      k[static_cast<size_t>(il)] = LayerKind::Recurrent;
  }
  return k;
}

std::string preset_list() {
  std::string s;
  for (const Preset& p : kPresets) s += (s.empty() ? "" : ", ") + std::string(p.name);
  return s;
}

struct Spec {
  const Preset* preset;
  DType type;
};

Spec parse_spec(std::string_view spec) {
  std::string_view name = spec, type = "q8_0";
  if (size_t c = spec.find(':'); c != std::string_view::npos) {
    name = spec.substr(0, c);
    type = spec.substr(c + 1);
  }
  for (const Preset& p : kPresets) {
    if (name == p.name) {
      return {&p, parse_dtype(type, cat("synthetic model '", spec, "'"))};
    }
  }
  fail("synthetic model '", spec, "': unknown preset '", name, "' (presets: ", preset_list(),
       "; spec is PRESET[:TYPE])");
}

int32_t head_dim(const Preset& p) {
  return p.head_dim > 0 ? p.head_dim : p.n_embd / p.n_head;
}

int32_t rope_dim(const Preset& p) {
  return p.rope_dim > 0 ? p.rope_dim : head_dim(p);
}

// llama.cpp's LLAMA_FTYPE for a model whose matrices are all `t`.
uint32_t file_type(DType t) {
  switch (t) {
    case DType::F32:
      return 0;
    case DType::F16:
      return 1;
    case DType::Q4_0:
      return 2;
    case DType::Q4_1:
      return 3;
    case DType::Q8_0:
      return 7;
    case DType::Q5_0:
      return 8;
    case DType::Q5_1:
      return 9;
    case DType::Q2_K:
      return 10;
    case DType::Q3_K:
      return 11;  // Q3_K_S
    case DType::Q4_K:
      return 14;  // Q4_K_S
    case DType::Q5_K:
      return 16;  // Q5_K_S
    case DType::Q6_K:
      return 18;
    case DType::IQ4_NL:
      return 25;
    case DType::IQ4_XS:
      return 30;
    case DType::BF16:
      return 32;
    default:
      return 0;
  }
}

// A row length the type's blocks do not divide gets a fallback, as llama.cpp's quantizer does.
DType fit_type(DType t, int64_t n_in) {
  if (n_in % traits(t).block == 0) return t;
  DType f = DType::Q8_0;
  if (t == DType::Q4_K)
    f = DType::Q5_0;
  else if (t == DType::Q5_K)
    f = DType::Q5_1;
  else if (t == DType::Q2_K || t == DType::Q3_K || t == DType::IQ4_XS)
    f = DType::IQ4_NL;
  if (n_in % traits(f).block == 0) return f;
  return DType::F16;
}

uint64_t fnv1a(std::string_view a, std::string_view b) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](std::string_view s) {
    for (char c : s) {
      h ^= static_cast<uint8_t>(c);
      h *= 1099511628211ull;
    }
  };
  mix(a);
  mix("/");
  mix(b);
  return h;
}

struct SplitMix {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi).
  float uniform(float lo, float hi) {
    const float u = static_cast<float>(next() >> 40) * (1.0f / 16777216.0f);
    return lo + (hi - lo) * u;
  }
};

class Builder {
 public:
  // values false: the matrices are zeros, for their shapes only (the vectors keep theirs).
  Builder(const Preset& p, DType type, bool values) : p_(p), type_(type), values_(values) {}
  gguf::Writer& writer() { return w_; }

  // n_out rows of n_in values uniform in [lo, hi), row-seeded, quantized to `type` in parallel.
  void tensor(const std::string& name, DType type, int64_t n_in, int64_t n_out, float lo,
              float hi) {
    const uint64_t seed = fnv1a(p_.name, name);
    const size_t rb = row_bytes(type, n_in);
    std::vector<uint8_t> buf(rb * static_cast<size_t>(n_out));
    const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / n_in);
    thread_pool().parallel_for(n_out, grain, [&](int64_t begin, int64_t end) {
      std::vector<float> row(static_cast<size_t>(n_in));
      for (int64_t r = begin; r < end; ++r) {
        SplitMix g{seed ^ (static_cast<uint64_t>(r) * 0xd1b54a32d192ed03ull)};
        g.next();
        for (float& x : row) x = g.uniform(lo, hi);
        quantize_row(type, row.data(), buf.data() + static_cast<size_t>(r) * rb, n_in);
      }
    });
    std::vector<int64_t> dims{n_in};
    if (n_out > 1) dims.push_back(n_out);
    w_.add_tensor(name, type, std::move(dims), buf.data(), buf.size());
  }
  void matrix(const std::string& name, int64_t n_in, int64_t n_out) {
    const DType t = fit_type(type_, n_in);
    if (!values_) {
      w_.add_tensor(name, t, {n_in, n_out}, nullptr, row_bytes(t, n_in) * static_cast<size_t>(n_out));
      return;
    }
    const float a = std::sqrt(3.0f) / std::sqrt(static_cast<float>(n_in));
    tensor(name, t, n_in, n_out, -a, a);
  }
  // The token embedding: values in [-1, 1) (zeros with the matrices).
  void embedding(const std::string& name, DType t, int64_t n_in, int64_t n_out) {
    if (!values_) {
      w_.add_tensor(name, t, {n_in, n_out}, nullptr, row_bytes(t, n_in) * static_cast<size_t>(n_out));
      return;
    }
    tensor(name, t, n_in, n_out, -1.0f, 1.0f);
  }
  void norm(const std::string& name, int64_t n) { tensor(name, DType::F32, n, 1, 0.8f, 1.2f); }
  void bias(const std::string& name, int64_t n) { tensor(name, DType::F32, n, 1, -0.1f, 0.1f); }

 private:
  const Preset& p_;
  DType type_;
  bool values_;
  gguf::Writer w_;
};

void set_metadata(gguf::Writer& w, const Preset& p, DType type, bool with_vocab) {
  using gguf::Value;
  const std::string a = arch_name(p.arch);
  w.set("general.architecture", Value::str(a));
  w.set("general.name", Value::str(p.display));
  w.set("general.alignment", Value::u32(32));
  w.set("general.file_type", Value::u32(file_type(type)));
  w.set(a + ".block_count", Value::u32(static_cast<uint32_t>(p.n_layer + p.n_nextn)));
  w.set(a + ".context_length", Value::u32(static_cast<uint32_t>(p.n_ctx)));
  w.set(a + ".embedding_length", Value::u32(static_cast<uint32_t>(p.n_embd)));
  w.set(a + ".feed_forward_length", Value::u32(static_cast<uint32_t>(p.n_ff)));
  w.set(a + ".attention.head_count", Value::u32(static_cast<uint32_t>(p.n_head)));
  w.set(a + ".attention.head_count_kv", Value::u32(static_cast<uint32_t>(p.n_head_kv)));
  if (p.head_dim > 0) {
    w.set(a + ".attention.key_length", Value::u32(static_cast<uint32_t>(p.head_dim)));
    w.set(a + ".attention.value_length", Value::u32(static_cast<uint32_t>(p.head_dim)));
  }
  w.set(a + ".attention.layer_norm_rms_epsilon", Value::f32(p.eps));
  w.set(a + ".rope.freq_base", Value::f32(p.rope_base));
  if (p.arch == Arch::Llama) {
    w.set(a + ".rope.dimension_count", Value::u32(static_cast<uint32_t>(head_dim(p))));
    w.set(a + ".vocab_size", Value::u32(static_cast<uint32_t>(p.n_vocab)));
  }
  if (p.n_swa > 0) {
    w.set(a + ".attention.sliding_window", Value::u32(static_cast<uint32_t>(p.n_swa)));
    w.set(a + ".rope.freq_base_swa", Value::f32(p.rope_base_swa));
  }
  if (p.arch == Arch::Qwen35) {
    w.set(a + ".rope.dimension_count", Value::u32(static_cast<uint32_t>(p.rope_dim)));
    // The published [11, 11, 10, 0] for 32 pairs: every pair on the t, h or w axis.
    const int32_t pairs = p.rope_dim / 2;
    gguf::Array sections;
    for (int32_t n : {(pairs + 2) / 3, (pairs + 1) / 3, pairs / 3, 0})
      sections.push_back(Value::i32(n));
    w.set(a + ".rope.dimension_sections", Value::array(gguf::ValueType::I32, std::move(sections)));
    w.set(a + ".full_attention_interval", Value::u32(static_cast<uint32_t>(p.full_interval)));
    w.set(a + ".ssm.conv_kernel", Value::u32(static_cast<uint32_t>(p.ssm_conv)));
    w.set(a + ".ssm.state_size", Value::u32(static_cast<uint32_t>(p.ssm_state)));
    w.set(a + ".ssm.group_count", Value::u32(static_cast<uint32_t>(p.ssm_k_heads)));
    w.set(a + ".ssm.time_step_rank", Value::u32(static_cast<uint32_t>(p.ssm_v_heads)));
    w.set(a + ".ssm.inner_size", Value::u32(static_cast<uint32_t>(p.ssm_v_heads * p.ssm_state)));
    if (p.n_nextn > 0)
      w.set(a + ".nextn_predict_layers", Value::u32(static_cast<uint32_t>(p.n_nextn)));
  }
  if (p.rope_linear_scale != 1.0f) {
    w.set(a + ".rope.scaling.type", Value::str("linear"));
    w.set(a + ".rope.scaling.factor", Value::f32(p.rope_linear_scale));
  }
  if (!with_vocab) return;
  SyntheticVocab v = make_synthetic_vocab(p.n_vocab);
  KVS_CHECK(static_cast<int32_t>(v.tokens.size()) == p.n_vocab, "synthetic vocab of ",
            v.tokens.size(), " tokens, expected ", p.n_vocab);
  w.set("tokenizer.ggml.model", Value::str(v.model));
  w.set("tokenizer.ggml.pre", Value::str(v.pre));
  gguf::Array tokens;
  tokens.reserve(v.tokens.size());
  for (std::string& t : v.tokens) tokens.push_back(Value::str(std::move(t)));
  w.set("tokenizer.ggml.tokens", Value::array(gguf::ValueType::STRING, std::move(tokens)));
  gguf::Array types;
  types.reserve(v.types.size());
  for (int32_t t : v.types) types.push_back(Value::i32(t));
  w.set("tokenizer.ggml.token_type", Value::array(gguf::ValueType::I32, std::move(types)));
  gguf::Array merges;
  merges.reserve(v.merges.size());
  for (std::string& m : v.merges) merges.push_back(Value::str(std::move(m)));
  w.set("tokenizer.ggml.merges", Value::array(gguf::ValueType::STRING, std::move(merges)));
  w.set("tokenizer.ggml.bos_token_id", Value::u32(static_cast<uint32_t>(v.bos)));
  w.set("tokenizer.ggml.eos_token_id", Value::u32(static_cast<uint32_t>(v.eos)));
  w.set("tokenizer.ggml.add_bos_token", Value::boolean(false));
  if (!v.chat_template.empty()) w.set("tokenizer.chat_template", Value::str(v.chat_template));
}

}  // namespace

namespace {

gguf::Writer writer_of(std::string_view spec, bool values, bool vocab) {
  const Spec s = parse_spec(spec);
  const Preset& p = *s.preset;
  Builder b(p, s.type, values);
  set_metadata(b.writer(), p, s.type, vocab);
  const int64_t d = p.n_embd, q_dim = int64_t{p.n_head} * head_dim(p),
                kv_dim = int64_t{p.n_head_kv} * head_dim(p);
  const bool gemma = p.arch == Arch::Gemma3, qwen35 = p.arch == Arch::Qwen35;
  const std::vector<LayerKind> kinds = preset_kinds(p);
  b.embedding("token_embd.weight", fit_type(s.type, d), d, p.n_vocab);
  for (int il = 0; il < p.n_layer + p.n_nextn; ++il) {
    auto n = [&](const char* what) { return cat("blk.", il, ".", what); };
    b.norm(n("attn_norm.weight"), d);
    if (il < p.n_layer && kinds[static_cast<size_t>(il)] == LayerKind::Recurrent) {
      const int64_t value_dim = int64_t{p.ssm_v_heads} * p.ssm_state,
                    conv_dim = 2 * int64_t{p.ssm_k_heads} * p.ssm_state + value_dim;
      b.matrix(n("attn_qkv.weight"), d, conv_dim);
      b.matrix(n("attn_gate.weight"), d, value_dim);
      b.tensor(n("ssm_conv1d.weight"), DType::F32, p.ssm_conv, conv_dim, -0.5f, 0.5f);
      // softplus(alpha + dt) near 0.05 .. 0.3 and a = -exp(A_log) in -2 .. -0.1: decays
      // per token of about 0.5 to 1, as in the trained models
      b.tensor(n("ssm_dt.bias"), DType::F32, p.ssm_v_heads, 1, -3.0f, -1.0f);
      b.tensor(n("ssm_a"), DType::F32, p.ssm_v_heads, 1, -2.0f, -0.1f);
      b.matrix(n("ssm_beta.weight"), d, p.ssm_v_heads);
      b.matrix(n("ssm_alpha.weight"), d, p.ssm_v_heads);
      b.norm(n("ssm_norm.weight"), p.ssm_state);
      b.matrix(n("ssm_out.weight"), value_dim, d);
    } else {
      b.matrix(n("attn_q.weight"), d, qwen35 ? 2 * q_dim : q_dim);
      b.matrix(n("attn_k.weight"), d, kv_dim);
      b.matrix(n("attn_v.weight"), d, kv_dim);
      if (p.bias) {
        b.bias(n("attn_q.bias"), q_dim);
        b.bias(n("attn_k.bias"), kv_dim);
        b.bias(n("attn_v.bias"), kv_dim);
      }
      if (p.qk_norm) {
        b.norm(n("attn_q_norm.weight"), head_dim(p));
        b.norm(n("attn_k_norm.weight"), head_dim(p));
      }
      b.matrix(n("attn_output.weight"), q_dim, d);
    }
    if (gemma || qwen35) b.norm(n("post_attention_norm.weight"), d);
    if (!qwen35) b.norm(n("ffn_norm.weight"), d);
    b.matrix(n("ffn_gate.weight"), d, p.n_ff);
    b.matrix(n("ffn_up.weight"), d, p.n_ff);
    b.matrix(n("ffn_down.weight"), p.n_ff, d);
    if (gemma) b.norm(n("post_ffw_norm.weight"), d);
    if (il >= p.n_layer) {
      b.matrix(n("nextn.eh_proj.weight"), 2 * d, d);
      b.norm(n("nextn.enorm.weight"), d);
      b.norm(n("nextn.hnorm.weight"), d);
      b.norm(n("nextn.shared_head_norm.weight"), d);
    }
  }
  b.norm("output_norm.weight", d);
  if (!p.tied) b.matrix("output.weight", d, p.n_vocab);
  return std::move(b.writer());
}

}  // namespace

gguf::Writer synthetic_writer(std::string_view spec, bool values) {
  return writer_of(spec, values, true);
}

std::unique_ptr<gguf::File> make_synthetic(std::string_view spec) {
  return gguf::File::from_writer(writer_of(spec, true, true), "synthetic:" + std::string(spec));
}

std::unique_ptr<gguf::File> synthetic_shapes(std::string_view spec) {
  return gguf::File::from_writer(writer_of(spec, false, false), "synthetic:" + std::string(spec));
}

std::vector<std::string> synthetic_presets() {
  std::vector<std::string> v;
  for (const Preset& p : kPresets) v.emplace_back(p.name);
  return v;
}

ModelConfig synthetic_config(std::string_view spec) {
  const Spec s = parse_spec(spec);
  const Preset& p = *s.preset;
  ModelConfig c;
  c.arch = p.arch;
  c.arch_name = arch_name(p.arch);
  c.name = p.display;
  c.n_layer = p.n_layer;
  c.n_embd = p.n_embd;
  c.n_ff = p.n_ff;
  c.n_head = p.n_head;
  c.n_head_kv = p.n_head_kv;
  c.head_dim = head_dim(p);
  c.n_vocab = p.n_vocab;
  c.n_ctx_train = p.n_ctx;
  c.norm_eps = p.eps;
  c.rope_mode = p.arch == Arch::Llama ? RopeMode::Norm : RopeMode::Neox;
  c.rope_dim = rope_dim(p);
  c.rope_base = p.rope_base;
  c.qkv_bias = p.bias;
  c.qk_norm = p.qk_norm;
  c.tied_embeddings = p.tied;
  c.rope_linear_scale = p.rope_linear_scale;
  c.kinds = preset_kinds(p);
  c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  if (p.arch == Arch::Gemma3) {
    c.n_swa = p.n_swa;
    c.rope_base_swa = p.rope_base_swa;
    c.act = Activation::GeluTanh;
    c.post_norms = true;
    c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
    // As ModelConfig::from_gguf: the 27B's query_pre_attn_scalar is n_embd / n_head.
    if (c.n_layer == 62) c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.n_embd / c.n_head));
  }
  if (p.arch == Arch::Qwen35) {
    c.attn_gate = true;
    c.ssm_conv = p.ssm_conv;
    c.ssm_state = p.ssm_state;
    c.ssm_k_heads = p.ssm_k_heads;
    c.ssm_v_heads = p.ssm_v_heads;
    c.n_nextn = p.n_nextn;
  }
  return c;
}

}  // namespace kvs
