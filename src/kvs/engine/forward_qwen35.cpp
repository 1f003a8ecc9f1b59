// qwen35's Gated DeltaNet layers (Qwen3.5/3.6 hybrids), each over its sequences' recurrent
// states, and their rollback after a verify step; the rest of its pass is the llama family's
// (forward_llama.cpp).
#include "kvs/engine/engine.h"

namespace kvs {

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
    DeltaNetArgs a = delta_net_args(e.seq->id, il, e.n);
    a.qkv = act_.mix + off * c.ssm_conv_dim();
    a.z = act_.z + off * vd;
    a.alpha = act_.alpha + off * c.ssm_v_heads;
    a.beta = act_.beta + off * c.ssm_v_heads;
    a.y = act_.y + off * vd;
    // Batch-invariant steps go token by token, so their states are a one-token step's bits (a
    // prompt cache's checkpoint resumes where a cold run would be).
    const Device::Caps& caps = dev_.caps();
    a.chunk = p.n_tok > caps.invariant_tokens && !e.all_logits ? caps.delta_net_chunk : 1;
    // Kept for a rollback, after the inputs of the steps this one extends.
    if (const int32_t verified = slots_[static_cast<size_t>(e.seq->id)].verified; verified > 0) {
      const auto [qkv, z, alpha, beta] = saved_inputs(e.seq->id, il);
      const int64_t row = verified - e.n;
      const auto keep = [&](float* dst, const float* src, int64_t width) {
        dev_.copy(Stream::Compute, dst + row * width, src,
                  static_cast<size_t>(e.n * width) * sizeof(float));
      };
      keep(qkv, a.qkv, c.ssm_conv_dim());
      keep(z, a.z, vd);
      keep(alpha, a.alpha, c.ssm_v_heads);
      keep(beta, a.beta, c.ssm_v_heads);
    }
    dev_.gated_delta_net(a);
  }
  const MatJob out{&L.ssm_out, act_.x, nullptr, true};
  dev_.matmuls(act_.y, n, &out, 1);
}

DeltaNetArgs Engine::delta_net_args(int32_t s, int32_t il, int32_t n_tok) const {
  const ModelConfig& c = cfg_;
  const LayerWeights& L = w_.layers[static_cast<size_t>(il)];
  DeltaNetArgs a;
  a.conv_state = recurrent_state(s, il);
  a.state = a.conv_state + int64_t{c.ssm_conv - 1} * c.ssm_conv_dim();
  a.conv_w = L.ssm_conv1d.data();
  a.dt_bias = L.ssm_dt.data();
  a.a = L.ssm_a.data();
  a.norm = L.ssm_norm.data();
  a.n_tok = n_tok;
  a.conv = c.ssm_conv;
  a.k_heads = c.ssm_k_heads;
  a.v_heads = c.ssm_v_heads;
  a.head = c.ssm_state;
  a.eps = c.norm_eps;
  return a;
}

std::array<float*, 4> Engine::saved_inputs(int32_t s, int32_t il) const {
  const ModelConfig& c = cfg_;
  const int64_t V = opt_.n_verify, vd = c.ssm_value_dim();
  const size_t i = static_cast<size_t>(s) * static_cast<size_t>(shape_.n_recurrent) +
                   static_cast<size_t>(rec_index_[static_cast<size_t>(il)]);
  float* in = reinterpret_cast<float*>(rinputs_.as()) +
              i * static_cast<size_t>(V) * static_cast<size_t>(rec_row_);
  return {in, in + V * c.ssm_conv_dim(), in + V * (c.ssm_conv_dim() + vd),
          in + V * (c.ssm_conv_dim() + vd + c.ssm_v_heads)};
}

void Engine::redo_recurrent(int32_t s, int32_t kept) {
  const size_t bytes = shape_.recurrent_bytes / slots_.size(), at = static_cast<size_t>(s) * bytes;
  dev_.copy(Stream::Compute, rstate_.as() + at, rsnap_.as() + at, bytes);
  for (int32_t il = 0; il < cfg_.n_layer; ++il) {
    if (!recurrent(il)) continue;
    const auto [qkv, z, alpha, beta] = saved_inputs(s, il);
    DeltaNetArgs a = delta_net_args(s, il, kept);
    a.qkv = qkv;
    a.z = z;
    a.alpha = alpha;
    a.beta = beta;
    a.y = act_.y;  // the outputs went into the verify step already
    a.chunk = 1;
    dev_.gated_delta_net(a);
  }
}

}  // namespace kvs
