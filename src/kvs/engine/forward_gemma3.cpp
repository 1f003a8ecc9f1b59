// Gemma 3's forward pass: scaled embeddings; window and full layers in the file's pattern, each
// with its rope base (self_attention); the attention and FFN outputs normed again before the
// residual add; GeGLU.
#include "kvs/engine/engine.h"

namespace kvs {

void Engine::forward_gemma3(Pass& p) {
  const ModelConfig& c = cfg_;
  const int64_t d = c.n_embd, nd = int64_t{p.n_tok} * d;
  const int32_t n = p.n_tok;
  float *x = act_.x, *h = act_.h, *att = act_.att, *gate = act_.gate, *up = act_.up;
  dev_.embed(w_.tok_embd, ids_.data(), n, x);
  dev_.scale(x, c.embd_scale, nd);
  for (int32_t il = 0; il < c.n_layer; ++il) {
    const LayerWeights& L = w_.layers[static_cast<size_t>(il)];
    dev_.rmsnorm(x, L.attn_norm.data(), h, n, d, c.norm_eps);
    self_attention(p, il);
    dev_.matmul(L.wo, att, h, n, nullptr);
    dev_.rmsnorm(h, L.attn_post_norm.data(), h, n, d, c.norm_eps);
    dev_.add(x, h, nd);

    dev_.rmsnorm(x, L.ffn_norm.data(), h, n, d, c.norm_eps);
    const MatJob ffn[] = {{&L.gate, gate}, {&L.up, up}};
    dev_.matmuls(h, n, ffn, 2);
    dev_.geglu(gate, up, int64_t{n} * c.n_ff);
    dev_.matmul(L.down, gate, h, n, nullptr);
    dev_.rmsnorm(h, L.ffn_post_norm.data(), h, n, d, c.norm_eps);
    dev_.add(x, h, nd);
  }
}

}  // namespace kvs
