// qwen35's forward pass (Qwen3.5/3.6 hybrids): Gated DeltaNet layers, each over its
// sequences' recurrent states, and gated full attention layers (self_attention), both
// pre-normed; the FFN's pre-norm is the file's post_attention_norm; SwiGLU.
#include "kvs/engine/engine.h"

namespace kvs {
namespace {

// Tokens a prefill's delta rule takes at once (decode goes token by token).
constexpr int32_t kDeltaNetChunk = 64;

}  // namespace

void Engine::forward_qwen35(Pass& p) {
  const ModelConfig& c = cfg_;
  const int64_t d = c.n_embd;
  const int32_t n = p.n_tok;
  float *x = act_.x, *h = act_.h, *att = act_.att;
  dev_.embed(w_.tok_embd, ids_.data(), n, x);
  for (int32_t il = 0; il < c.n_layer; ++il) {
    const LayerWeights& L = w_.layers[static_cast<size_t>(il)];
    dev_.rmsnorm(x, L.attn_norm.data(), h, n, d, c.norm_eps);
    if (recurrent(il)) {
      gated_delta_net(p, il);
    } else {
      self_attention(p, il);
      const MatJob out{&L.wo, x, nullptr, true};
      dev_.matmuls(att, n, &out, 1);
    }
    swiglu_ffn(il, n);
  }
}

void Engine::gated_delta_net(Pass& p, int32_t il) {
  const ModelConfig& c = cfg_;
  const LayerWeights& L = w_.layers[static_cast<size_t>(il)];
  const int32_t n = p.n_tok;
  const MatJob in[] = {{&L.ssm_qkv, act_.mix},
                       {&L.ssm_z, act_.z},
                       {&L.ssm_alpha, act_.alpha},
                       {&L.ssm_beta, act_.beta}};
  dev_.matmuls(act_.h, n, in, 4);
  const int64_t vd = c.ssm_value_dim();
  for (size_t i = 0; i < p.batch.size(); ++i) {
    const BatchEntry& e = p.batch[i];
    const int64_t off = p.offs[i];
    float* conv_state = recurrent_state(e.seq->id, il);
    DeltaNetArgs a;
    a.qkv = act_.mix + off * c.ssm_conv_dim();
    a.z = act_.z + off * vd;
    a.alpha = act_.alpha + off * c.ssm_v_heads;
    a.beta = act_.beta + off * c.ssm_v_heads;
    a.y = act_.y + off * vd;
    a.conv_state = conv_state;
    a.state = conv_state + int64_t{c.ssm_conv - 1} * c.ssm_conv_dim();
    a.conv_w = L.ssm_conv1d.data();
    a.dt_bias = L.ssm_dt.data();
    a.a = L.ssm_a.data();
    a.norm = L.ssm_norm.data();
    a.n_tok = e.n;
    a.conv = c.ssm_conv;
    a.k_heads = c.ssm_k_heads;
    a.v_heads = c.ssm_v_heads;
    a.head = c.ssm_state;
    a.eps = c.norm_eps;
    a.chunk = e.n > 1 && !e.all_logits ? kDeltaNetChunk : 1;
    if (slots_[static_cast<size_t>(e.seq->id)].verified > 0) {  // kept for a rollback
      float* saved = rec_inputs(e.seq->id, il);
      const int64_t V = opt_.n_verify;
      const auto keep = [&](const float* src, int64_t width, int64_t at) {
        dev_.copy(Stream::Compute, saved + at, src, static_cast<size_t>(e.n * width) * sizeof(float));
      };
      keep(a.qkv, c.ssm_conv_dim(), 0);
      keep(a.z, vd, V * c.ssm_conv_dim());
      keep(a.alpha, c.ssm_v_heads, V * (c.ssm_conv_dim() + vd));
      keep(a.beta, c.ssm_v_heads, V * (c.ssm_conv_dim() + vd + c.ssm_v_heads));
    }
    dev_.gated_delta_net(a);
  }
  const MatJob out{&L.ssm_out, act_.x, nullptr, true};
  dev_.matmuls(act_.y, n, &out, 1);
}

void Engine::redo_recurrent(int32_t s, int32_t kept) {
  const ModelConfig& c = cfg_;
  const size_t bytes = shape_.recurrent_bytes / slots_.size(), at = static_cast<size_t>(s) * bytes;
  dev_.copy(Stream::Compute, rstate_.as() + at, rsnap_.as() + at, bytes);
  const int64_t V = opt_.n_verify, vd = c.ssm_value_dim();
  for (int32_t il = 0; il < c.n_layer; ++il) {
    if (!recurrent(il)) continue;
    const LayerWeights& L = w_.layers[static_cast<size_t>(il)];
    const float* in = rec_inputs(s, il);
    DeltaNetArgs a;
    a.qkv = in;
    a.z = in + V * c.ssm_conv_dim();
    a.alpha = in + V * (c.ssm_conv_dim() + vd);
    a.beta = in + V * (c.ssm_conv_dim() + vd + c.ssm_v_heads);
    a.y = act_.y;  // the outputs went into the verify step already
    a.conv_state = recurrent_state(s, il);
    a.state = a.conv_state + int64_t{c.ssm_conv - 1} * c.ssm_conv_dim();
    a.conv_w = L.ssm_conv1d.data();
    a.dt_bias = L.ssm_dt.data();
    a.a = L.ssm_a.data();
    a.norm = L.ssm_norm.data();
    a.n_tok = kept;
    a.conv = c.ssm_conv;
    a.k_heads = c.ssm_k_heads;
    a.v_heads = c.ssm_v_heads;
    a.head = c.ssm_state;
    a.eps = c.norm_eps;
    a.chunk = 1;
    dev_.gated_delta_net(a);
  }
}

}  // namespace kvs
