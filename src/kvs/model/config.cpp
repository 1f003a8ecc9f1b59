#include "kvs/model/config.h"

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
  }
  return "?";
}

ModelConfig ModelConfig::from_gguf(const gguf::File& f) {
  ModelConfig c;
  c.arch_name = f.get_string("general.architecture");
  if (c.arch_name == "llama")
    c.arch = Arch::Llama;
  else if (c.arch_name == "qwen2")
    c.arch = Arch::Qwen2;
  else if (c.arch_name == "qwen3")
    c.arch = Arch::Qwen3;
  else
    fail(f.name(), ": architecture '", c.arch_name,
         "' is not supported (supported: llama, qwen2, qwen3)");
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
  return c;
}

}  // namespace kvs
