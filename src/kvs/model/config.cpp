#include "kvs/model/config.h"

#include <cmath>

#include "kvs/gguf/gguf.h"
#include "kvs/util/error.h"

namespace kvs {

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::Llama:
      return "llama";
    case Arch::Qwen2:
      return "qwen2";
    case Arch::Qwen3:
      return "qwen3";
    case Arch::Gemma3:
      return "gemma3";
    case Arch::Qwen35:
      return "qwen35";
  }
  return "?";
}

int32_t ModelConfig::n_layers_of(LayerKind k) const {
  int32_t n = 0;
  for (LayerKind x : kinds) n += x == k;
  return n;
}

namespace {

// Gemma 3's window layers: gemma3.attention.sliding_window_pattern as one bool per layer (true:
// window), or as a period n (window unless il % n == n - 1); without the key, a period of 6, as
// every published file (layers 5, 11, 17, ... global).
std::vector<LayerKind> swa_pattern(const gguf::File& f, const std::string& key, int32_t n_layer) {
  std::vector<LayerKind> kinds(static_cast<size_t>(n_layer), LayerKind::Full);
  const gguf::Value* v = f.find(key);
  int64_t period = 6;
  if (v && v->type == gguf::ValueType::ARRAY) {
    const gguf::Array& a = v->as_array(key);
    KVS_CHECK(static_cast<int64_t>(a.size()) == n_layer, f.name(), ": ", key, " has ", a.size(),
              " entries for ", n_layer, " layers");
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i].as_bool(key)) kinds[i] = LayerKind::Window;
    return kinds;
  }
  if (v) period = v->as_int(key);
  KVS_CHECK(period >= 0 && period <= n_layer + 1, f.name(), ": ", key, " = ", period,
            " is not a layer pattern (a period of 0 to ", n_layer + 1, ", or one bool per layer)");
  for (int32_t il = 0; il < n_layer; ++il)
    if (period == 0 || il % period < period - 1) kinds[static_cast<size_t>(il)] = LayerKind::Window;
  return kinds;
}

// qwen35's layer map as llama.cpp reads it: qwen35.attention.recurrent_layers, one bool per
// block (MTP blocks included), or else qwen35.full_attention_interval n (default 4): layer il
// is full attention where (il + 1) % n == 0.
std::vector<LayerKind> qwen35_kinds(const gguf::File& f, const ModelConfig& c) {
  std::vector<LayerKind> kinds(static_cast<size_t>(c.n_layer), LayerKind::Recurrent);
  const std::string list = "qwen35.attention.recurrent_layers";
  if (const gguf::Value* v = f.find(list); v && v->type == gguf::ValueType::ARRAY) {
    const gguf::Array& a = v->as_array(list);
    KVS_CHECK(static_cast<int64_t>(a.size()) == c.n_layer + c.n_nextn, f.name(), ": ", list,
              " has ", a.size(), " entries for ", c.n_layer + c.n_nextn, " blocks");
    for (int32_t il = 0; il < c.n_layer; ++il)
      if (!a[static_cast<size_t>(il)].as_bool(list))
        kinds[static_cast<size_t>(il)] = LayerKind::Full;
    return kinds;
  }
  const std::string key = "qwen35.full_attention_interval";
  const int64_t n = f.get_int(key, 4);
  KVS_CHECK(n > 0 && n <= c.n_layer && c.n_layer % n == 0, f.name(), ": ", key, " = ", n,
            " does not divide the ", c.n_layer, " layers");
  for (int32_t il = 0; il < c.n_layer; ++il)
    if ((il + 1) % n == 0) kinds[static_cast<size_t>(il)] = LayerKind::Full;
  return kinds;
}

// Text tokens have the positions (p, p, p, 0) on the rope's four axes; llama.cpp's interleaved
// sections give pair i the axis of sector s = i % sum: h where s % 3 == 1 and s < 3 * sec[1], w
// where s % 3 == 2 and s < 3 * sec[2], t where s % 3 == 0 and s < 3 * sec[0], else e. Every
// rotated pair on t, h or w makes it plain NEOX rope; a pair on e (rotated by 0) is refused.
void check_rope_sections(const gguf::File& f, const ModelConfig& c) {
  const std::string key = "qwen35.rope.dimension_sections";
  const gguf::Value* v = f.find(key);
  KVS_CHECK(v && v->type == gguf::ValueType::ARRAY, f.name(), ": ", key, " is missing");
  const gguf::Array& a = v->as_array(key);
  int64_t sec[4] = {0, 0, 0, 0}, sum = 0;
  for (size_t i = 0; i < a.size() && i < 4; ++i) {
    sec[i] = a[i].as_int(key);
    KVS_CHECK(sec[i] >= 0 && sec[i] <= 4096, f.name(), ": ", key, "[", i, "] = ", sec[i],
              " is out of range");
    sum += sec[i];
  }
  KVS_CHECK(sum > 0, f.name(), ": ", key, " sums to 0");
  for (int64_t i = 0; i < c.rope_dim / 2; ++i) {
    const int64_t s = i % sum;
    const bool at_p = (s % 3 == 0 && s < 3 * sec[0]) || (s % 3 == 1 && s < 3 * sec[1]) ||
                      (s % 3 == 2 && s < 3 * sec[2]);
    KVS_CHECK(at_p, f.name(), ": ", key, " = [", sec[0], ", ", sec[1], ", ", sec[2], ", ", sec[3],
              "] puts rope pair ", i, " on the fourth axis, which is not supported");
  }
}

void qwen35_config(const gguf::File& f, ModelConfig& c) {
  auto get = [&](const char* key) {
    const int64_t v = f.get_int(std::string("qwen35.") + key);
    KVS_CHECK(v > 0 && v <= (int64_t{1} << 20), f.name(), ": qwen35.", key, " = ", v,
              " is out of range");
    return static_cast<int32_t>(v);
  };
  c.attn_gate = true;
  c.qk_norm = true;
  c.kinds = qwen35_kinds(f, c);
  check_rope_sections(f, c);
  c.ssm_conv = get("ssm.conv_kernel");
  c.ssm_state = get("ssm.state_size");
  c.ssm_k_heads = get("ssm.group_count");
  c.ssm_v_heads = get("ssm.time_step_rank");
  const int32_t inner = get("ssm.inner_size");
  KVS_CHECK(c.ssm_conv >= 2 && c.ssm_conv <= 16, f.name(),
            ": qwen35.ssm.conv_kernel = ", c.ssm_conv, " is not supported (2 to 16 taps)");
  KVS_CHECK(c.ssm_v_heads % c.ssm_k_heads == 0, f.name(),
            ": qwen35.ssm.time_step_rank (value heads) ", c.ssm_v_heads,
            " is not a multiple of qwen35.ssm.group_count (key heads) ", c.ssm_k_heads);
  KVS_CHECK(inner == c.ssm_value_dim(), f.name(), ": qwen35.ssm.inner_size ", inner, " is not ",
            c.ssm_v_heads, " value heads of qwen35.ssm.state_size ", c.ssm_state);
}

}  // namespace

ModelConfig ModelConfig::from_gguf(const gguf::File& f) {
  ModelConfig c;
  c.arch_name = f.get_string("general.architecture");
  if (c.arch_name == "llama")
    c.arch = Arch::Llama;
  else if (c.arch_name == "qwen2")
    c.arch = Arch::Qwen2;
  else if (c.arch_name == "qwen3")
    c.arch = Arch::Qwen3;
  else if (c.arch_name == "gemma3")
    c.arch = Arch::Gemma3;
  else if (c.arch_name == "qwen35")
    c.arch = Arch::Qwen35;
  else
    fail(f.name(), ": architecture '", c.arch_name,
         "' is not supported (supported: llama, qwen2, qwen3, gemma3, qwen35)");
  c.name = f.get_string("general.name", std::string());
  const std::string a = c.arch_name + ".";
  auto get = [&](const char* key, std::optional<int64_t> def = std::nullopt) {
    int64_t v = f.get_int(a + key, def);
    if (v < 0 || v > (int64_t{1} << 30)) fail(f.name(), ": ", a, key, " = ", v, " is out of range");
    return static_cast<int32_t>(v);
  };
  c.n_layer = get("block_count");
  if (c.arch == Arch::Qwen35) {
    // block_count counts the MTP blocks appended after the trunk
    c.n_nextn = get("nextn_predict_layers", 0);
    KVS_CHECK(c.n_nextn < c.n_layer, f.name(), ": ", a, "nextn_predict_layers = ", c.n_nextn,
              " leaves no layers of ", c.n_layer, " blocks");
    c.n_layer -= c.n_nextn;
  }
  c.n_embd = get("embedding_length");
  c.n_ff = get("feed_forward_length");
  c.n_head = get("attention.head_count");
  c.n_head_kv = get("attention.head_count_kv", c.n_head);
  c.n_ctx_train = get("context_length", 4096);
  KVS_CHECK(c.n_layer > 0 && c.n_embd > 0 && c.n_ff > 0 && c.n_head > 0 && c.n_head_kv > 0,
            f.name(),
            ": block_count, embedding_length, feed_forward_length and head counts must "
            "be positive");
  KVS_CHECK(c.n_head % c.n_head_kv == 0, f.name(), ": head_count ", c.n_head,
            " is not a multiple of head_count_kv ", c.n_head_kv);
  c.head_dim = get("attention.key_length", c.n_embd / c.n_head);
  int32_t v_len = get("attention.value_length", c.head_dim);
  KVS_CHECK(v_len == c.head_dim, f.name(), ": value_length ", v_len, " != key_length ", c.head_dim,
            " is not supported");
  KVS_CHECK(c.head_dim > 0 && c.head_dim % 32 == 0 && c.head_dim <= 512, f.name(), ": head size ",
            c.head_dim, " is not supported (a multiple of 32, at most 512)");
  c.norm_eps = static_cast<float>(f.get_float(a + "attention.layer_norm_rms_epsilon", 1e-5));
  c.rope_base = static_cast<float>(f.get_float(a + "rope.freq_base", 10000.0));
  c.rope_dim = get("rope.dimension_count", c.head_dim);
  KVS_CHECK(c.rope_dim > 0 && c.rope_dim <= c.head_dim && c.rope_dim % 2 == 0, f.name(), ": ", a,
            "rope.dimension_count ", c.rope_dim, " does not fit head size ", c.head_dim);
  std::string scaling = f.get_string(a + "rope.scaling.type", std::string("none"));
  if (scaling == "linear") {
    c.rope_linear_scale = static_cast<float>(f.get_float(a + "rope.scaling.factor", 1.0));
    KVS_CHECK(c.rope_linear_scale > 0, f.name(), ": rope.scaling.factor must be positive");
  } else if (scaling != "none") {
    fail(f.name(), ": rope scaling '", scaling, "' is not supported (supported: none, linear)");
  }
  c.rope_mode = c.arch == Arch::Llama ? RopeMode::Norm : RopeMode::Neox;
  c.has_rope_freqs = f.find_tensor("rope_freqs.weight") != nullptr;
  c.qkv_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  c.qk_norm = f.find_tensor("blk.0.attn_q_norm.weight") != nullptr;
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  const gguf::TensorInfo& emb = f.tensor("token_embd.weight");
  KVS_CHECK(emb.dims.size() == 2 && emb.dims[0] == c.n_embd, f.name(),
            ": token_embd.weight has the wrong shape for embedding_length ", c.n_embd);
  c.n_vocab = static_cast<int32_t>(emb.dims[1]);

  c.kinds.assign(static_cast<size_t>(c.n_layer), LayerKind::Full);
  c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  if (c.arch == Arch::Gemma3) {
    c.act = Activation::GeluTanh;
    c.post_norms = true;
    c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
    KVS_CHECK(c.qk_norm, f.name(), ": gemma3 without blk.0.attn_q_norm.weight");
    // Gemma 3 27B scales by its n_embd / n_head (168), not its head size (128): the HF
    // config's query_pre_attn_scalar, which the GGUF does not carry.
    if (c.n_layer == 62) c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.n_embd / c.n_head));
    const int64_t w = f.get_int(a + "attention.sliding_window", 0);
    KVS_CHECK(w >= 0 && w <= (int64_t{1} << 30), f.name(), ": ", a,
              "attention.sliding_window = ", w, " is out of range");
    c.n_swa = static_cast<int32_t>(w);
    KVS_CHECK(c.n_swa <= c.n_ctx_train, f.name(), ": ", a, "attention.sliding_window = ", w,
              " is larger than its context_length ", c.n_ctx_train);
    if (c.n_swa > 0) {
      c.kinds = swa_pattern(f, a + "attention.sliding_window_pattern", c.n_layer);
      c.rope_base_swa = static_cast<float>(f.get_float(a + "rope.freq_base_swa", 10000.0));
    }
    const double cap = f.get_float(a + "final_logit_softcapping", 0.0);
    KVS_CHECK(cap == 0, f.name(), ": ", a, "final_logit_softcapping = ", cap,
              " is not supported (Gemma 3 files have none)");
  }
  if (c.arch == Arch::Qwen35) qwen35_config(f, c);
  return c;
}

}  // namespace kvs
