#include "kvs/model/weights.h"

#include "kvs/gguf/gguf.h"
#include "kvs/util/error.h"

namespace kvs {
namespace {

std::string layer_name(int il, const char* what) {
  return cat("blk.", il, ".", what, ".weight");
}

Matrix matrix(const gguf::File& f, const std::string& name, int64_t n_in, int64_t n_out) {
  const gguf::TensorInfo& t = f.tensor(name);
  KVS_CHECK(t.dims.size() == 2 && t.dims[0] == n_in && t.dims[1] == n_out, f.name(), ": tensor '",
            name, "' has shape ", t.dims.size() > 0 ? t.dims[0] : 0, "x",
            t.dims.size() > 1 ? t.dims[1] : 0, ", expected ", n_in, "x", n_out);
  KVS_CHECK(is_supported(t.type), f.name(), ": tensor '", name, "' has type ", dtype_name(t.type),
            ", which kvstream cannot compute with (supported: ", supported_dtype_names(), ")");
  Matrix m;
  m.type = t.type;
  m.n_in = n_in;
  m.n_out = n_out;
  m.row_bytes = row_bytes(t.type, n_in);
  m.data = t.data;
  return m;
}

Vec vec(const gguf::File& f, const std::string& name, int64_t n, bool required = true) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (!t) {
    KVS_CHECK(!required, f.name(), ": tensor '", name, "' is missing");
    return {};
  }
  KVS_CHECK(t->n_elements() == n, f.name(), ": tensor '", name, "' has ", t->n_elements(),
            " elements, expected ", n);
  KVS_CHECK(t->type == DType::F32 || t->type == DType::F16 || t->type == DType::BF16, f.name(),
            ": tensor '", name, "' has type ", dtype_name(t->type), ", expected f32, f16 or bf16");
  Vec v(static_cast<size_t>(n));
  dequantize_row(t->type, t->data, v.data(), n);
  return v;
}

// A full attention layer's projections and q/k norms (qwen35: wq doubled for the gate).
void load_attention(const gguf::File& f, const ModelConfig& c, int il, LayerWeights& l) {
  l.wq = matrix(f, layer_name(il, "attn_q"), c.n_embd, c.attn_gate ? 2 * c.q_dim() : c.q_dim());
  l.wk = matrix(f, layer_name(il, "attn_k"), c.n_embd, c.kv_dim());
  l.wv = matrix(f, layer_name(il, "attn_v"), c.n_embd, c.kv_dim());
  l.wo = matrix(f, layer_name(il, "attn_output"), c.q_dim(), c.n_embd);
  if (c.qkv_bias) {
    l.bq = vec(f, cat("blk.", il, ".attn_q.bias"), c.q_dim());
    l.bk = vec(f, cat("blk.", il, ".attn_k.bias"), c.kv_dim());
    l.bv = vec(f, cat("blk.", il, ".attn_v.bias"), c.kv_dim());
  }
  if (c.qk_norm) {
    l.q_norm = vec(f, layer_name(il, "attn_q_norm"), c.head_dim);
    l.k_norm = vec(f, layer_name(il, "attn_k_norm"), c.head_dim);
  }
}

void load_gated_delta_net(const gguf::File& f, const ModelConfig& c, int il, LayerWeights& l) {
  l.ssm_qkv = matrix(f, layer_name(il, "attn_qkv"), c.n_embd, c.ssm_conv_dim());
  l.ssm_z = matrix(f, layer_name(il, "attn_gate"), c.n_embd, c.ssm_value_dim());
  l.ssm_beta = matrix(f, layer_name(il, "ssm_beta"), c.n_embd, c.ssm_v_heads);
  l.ssm_alpha = matrix(f, layer_name(il, "ssm_alpha"), c.n_embd, c.ssm_v_heads);
  l.ssm_out = matrix(f, layer_name(il, "ssm_out"), c.ssm_value_dim(), c.n_embd);
  l.ssm_conv1d = vec(f, layer_name(il, "ssm_conv1d"), int64_t{c.ssm_conv_dim()} * c.ssm_conv);
  l.ssm_dt = vec(f, cat("blk.", il, ".ssm_dt.bias"), c.ssm_v_heads);
  l.ssm_a = vec(f, cat("blk.", il, ".ssm_a"), c.ssm_v_heads);
  l.ssm_norm = vec(f, layer_name(il, "ssm_norm"), c.ssm_state);
}

// The FFN and its pre-norm, which qwen35 files call post_attention_norm.
void load_ffn(const gguf::File& f, const ModelConfig& c, int il, LayerWeights& l) {
  l.ffn_norm =
      vec(f, layer_name(il, c.arch == Arch::Qwen35 ? "post_attention_norm" : "ffn_norm"), c.n_embd);
  l.gate = matrix(f, layer_name(il, "ffn_gate"), c.n_embd, c.n_ff);
  l.up = matrix(f, layer_name(il, "ffn_up"), c.n_embd, c.n_ff);
  l.down = matrix(f, layer_name(il, "ffn_down"), c.n_ff, c.n_embd);
}

NextnWeights load_nextn(const gguf::File& f, const ModelConfig& c, int il) {
  NextnWeights n;
  n.block.attn_norm = vec(f, layer_name(il, "attn_norm"), c.n_embd);
  load_attention(f, c, il, n.block);
  load_ffn(f, c, il, n.block);
  n.eh_proj = matrix(f, layer_name(il, "nextn.eh_proj"), 2 * int64_t{c.n_embd}, c.n_embd);
  n.enorm = vec(f, layer_name(il, "nextn.enorm"), c.n_embd);
  n.hnorm = vec(f, layer_name(il, "nextn.hnorm"), c.n_embd);
  if (f.find_tensor(layer_name(il, "nextn.embed_tokens")))
    n.embed_tokens = matrix(f, layer_name(il, "nextn.embed_tokens"), c.n_embd, c.n_vocab);
  if (f.find_tensor(layer_name(il, "nextn.shared_head_head")))
    n.shared_head_head = matrix(f, layer_name(il, "nextn.shared_head_head"), c.n_embd, c.n_vocab);
  n.shared_head_norm = vec(f, layer_name(il, "nextn.shared_head_norm"), c.n_embd, false);
  return n;
}

}  // namespace

Weights Weights::from_gguf(const gguf::File& f, const ModelConfig& c) {
  Weights w;
  w.tok_embd = matrix(f, "token_embd.weight", c.n_embd, c.n_vocab);
  w.output_norm = vec(f, "output_norm.weight", c.n_embd);
  w.output = c.tied_embeddings ? w.tok_embd : matrix(f, "output.weight", c.n_embd, c.n_vocab);
  if (c.has_rope_freqs) w.rope_freqs = vec(f, "rope_freqs.weight", c.rope_dim / 2);
  w.layers.resize(static_cast<size_t>(c.n_layer));
  for (int il = 0; il < c.n_layer; ++il) {
    LayerWeights& l = w.layers[static_cast<size_t>(il)];
    l.attn_norm = vec(f, layer_name(il, "attn_norm"), c.n_embd);
    if (c.kinds[static_cast<size_t>(il)] == LayerKind::Recurrent)
      load_gated_delta_net(f, c, il, l);
    else
      load_attention(f, c, il, l);
    if (c.post_norms) {
      l.attn_post_norm = vec(f, layer_name(il, "post_attention_norm"), c.n_embd);
      l.ffn_post_norm = vec(f, layer_name(il, "post_ffw_norm"), c.n_embd);
    }
    load_ffn(f, c, il, l);
  }
  for (int i = 0; i < c.n_nextn; ++i) w.nextn.push_back(load_nextn(f, c, c.n_layer + i));
  return w;
}

size_t Weights::matrix_bytes() const {
  size_t n = output.bytes();
  for (const LayerWeights& l : layers)
    n += l.wq.bytes() + l.wk.bytes() + l.wv.bytes() + l.wo.bytes() + l.gate.bytes() + l.up.bytes() +
         l.down.bytes() + l.ssm_qkv.bytes() + l.ssm_z.bytes() + l.ssm_beta.bytes() +
         l.ssm_alpha.bytes() + l.ssm_out.bytes();
  return n;
}

}  // namespace kvs
