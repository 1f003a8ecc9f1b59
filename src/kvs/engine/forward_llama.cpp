// The llama family's forward pass (llama, qwen2, qwen3, and qwen35, whose recurrent layers take
// the attention's place: forward_qwen35.cpp): pre-norm blocks and the SwiGLU FFN (qwen35's FFN
// pre-norm is the file's post_attention_norm).
#include "kvs/engine/engine.h"

#include <algorithm>

namespace kvs {

void Engine::forward_llama(Pass& p) {
  const ModelConfig& c = cfg_;
  const int64_t d = c.n_embd;
  const int32_t n = p.n_tok;
  float *x = act_.x, *h = act_.h, *att = act_.att;
  embed_inputs(p);
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

void Engine::embed_inputs(const Pass& p) {
  const bool rows = std::any_of(p.batch.begin(), p.batch.end(),
                                [](const BatchEntry& e) { return e.embd != nullptr; });
  if (!rows) {
    dev_.embed(w_.tok_embd, ids_.data(), p.n_tok, act_.x);
    return;
  }
  const int64_t d = cfg_.n_embd;
  for (size_t i = 0; i < p.batch.size(); ++i) {
    const BatchEntry& e = p.batch[i];
    float* x = act_.x + p.offs[i] * d;
    if (e.embd)
      dev_.copy(Stream::Compute, x, e.embd, static_cast<size_t>(e.n * d) * sizeof(float));
    else
      dev_.embed(w_.tok_embd, ids_.data() + p.offs[i], e.n, x);
  }
}

void Engine::swiglu_ffn(int32_t il, int32_t n) {
  const ModelConfig& c = cfg_;
  const LayerWeights& L = w_.layers[static_cast<size_t>(il)];
  float *x = act_.x, *h = act_.h, *gate = act_.gate, *up = act_.up;
  dev_.rmsnorm(x, L.ffn_norm.data(), h, n, c.n_embd, c.norm_eps);
  const MatJob ffn[] = {{&L.gate, gate}, {&L.up, up}};
  dev_.matmuls(h, n, ffn, 2);
  dev_.swiglu(gate, up, int64_t{n} * c.n_ff);
  const MatJob down{&L.down, x, nullptr, true};
  dev_.matmuls(gate, n, &down, 1);
}

}  // namespace kvs
