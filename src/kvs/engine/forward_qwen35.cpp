// qwen35's Gated DeltaNet layers (Qwen3.5/3.6 hybrids), each over its sequences' recurrent
// states (recurrent.h, which also rolls them back after a verify step); the rest of its pass is the
// llama family's (forward_llama.cpp).
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
    DeltaNetArgs a = rec_->args(e.seq->id, il, e.n, L);
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
    if (const int32_t verified = rec_->verified(e.seq->id); verified > 0) {
      const auto [qkv, z, alpha, beta] = rec_->saved_inputs(e.seq->id, il);
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

}  // namespace kvs
