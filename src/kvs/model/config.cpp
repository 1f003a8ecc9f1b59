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
  }
  return "?";
}

const char* layer_kind_name(LayerKind k) {
  switch (k) {
    case LayerKind::Full:
      return "full";
    case LayerKind::Window:
      return "window";
    case LayerKind::Recurrent:
      return "recurrent";
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
  else
    fail(f.name(), ": architecture '", c.arch_name,
         "' is not supported (supported: llama, qwen2, qwen3, gemma3)");
  c.name = f.get_string("general.name", std::string());
  const std::string a = c.arch_name + ".";
  auto get = [&](const char* key, std::optional<int64_t> def = std::nullopt) {
    int64_t v = f.get_int(a + key, def);
    if (v < 0 || v > (int64_t{1} << 30)) fail(f.name(), ": ", a, key, " = ", v, " is out of range");
    return static_cast<int32_t>(v);
  };
  c.n_layer = get("block_count");
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
    KVS_CHECK(w >= 0 && w <= (int64_t{1} << 30), f.name(), ": ", a, "attention.sliding_window = ",
              w, " is out of range");
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
  return c;
}

}  // namespace kvs
