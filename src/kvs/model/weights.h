// Views of a model's weights. Matrices stay in their file format (a device's place_weights may
// repack them for its kernels); the small vectors (norms, biases, rope factors) are converted to
// f32 at load.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "kvs/model/config.h"
#include "kvs/quant/types.h"

namespace kvs {
namespace gguf {
class File;
}

// A weight matrix of n_out rows, each n_in elements in `type`: y[n_out] = W x[n_in].
struct Matrix {
  DType type = DType::F32;
  int64_t n_in = 0, n_out = 0;
  size_t row_bytes = 0;
  const uint8_t* data = nullptr;  // not owned: the model file, or device memory
  const uint8_t* row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes; }
  size_t bytes() const { return row_bytes * static_cast<size_t>(n_out); }
};

using Vec = std::vector<float>;  // empty when the model does not have it

// A layer's weights; a Recurrent layer has the ssm ones instead of wq .. k_norm.
struct LayerWeights {
  Vec attn_norm;          // [n_embd]
  Matrix wq, wk, wv, wo;  // [q_dim x n_embd], [kv_dim x n_embd] x2, [n_embd x q_dim]
                          // (qwen35: wq [2 q_dim x n_embd], per head [q, gate])
  Vec bq, bk, bv;         // qwen2 biases [q_dim], [kv_dim], [kv_dim]
  Vec q_norm, k_norm;     // qwen3, gemma3 [head_dim]
  Vec attn_post_norm;     // gemma3 [n_embd]
  Vec ffn_norm;           // [n_embd] (qwen35: the file's post_attention_norm)
  Matrix gate, up, down;  // [n_ff x n_embd] x2, [n_embd x n_ff]
  Vec ffn_post_norm;      // gemma3 [n_embd]

  // qwen35 Gated DeltaNet (ModelConfig's ssm sizes; conv_dim = 2 key_dim + value_dim)
  Matrix ssm_qkv;              // attn_qkv [conv_dim x n_embd]: q, k, v rows
  Matrix ssm_z;                // attn_gate [value_dim x n_embd]: the output norm's gate
  Matrix ssm_beta, ssm_alpha;  // [ssm_v_heads x n_embd]
  Matrix ssm_out;              // [n_embd x value_dim]
  Vec ssm_conv1d;              // [conv_dim x ssm_conv]: tap j of channel c at c * ssm_conv + j
  Vec ssm_dt;                  // [ssm_v_heads] added to alpha before the softplus
  Vec ssm_a;                   // [ssm_v_heads] -exp(A_log), the decay's rate
  Vec ssm_norm;                // [ssm_state] the gated RMSNorm of each value head
};

// qwen35's MTP block (blk.n_layer ..): a gated attention layer fed by
// eh_proj([enorm(embedding); hnorm(hidden)]). Loaded for speculation, not run by the trunk.
struct NextnWeights {
  LayerWeights block;
  Matrix eh_proj;                         // [n_embd x 2 n_embd]
  Vec enorm, hnorm;                       // [n_embd]
  Matrix embed_tokens, shared_head_head;  // [n_vocab x n_embd], absent (n_out 0) unless given
  Vec shared_head_norm;                   // [n_embd], empty unless given
};

struct Weights {
  Matrix tok_embd;  // [n_vocab x n_embd]
  Vec output_norm;  // [n_embd]
  Matrix output;    // [n_vocab x n_embd]; the embedding when tied
  Vec rope_freqs;   // [rope_dim / 2], empty when absent
  std::vector<LayerWeights> layers;
  std::vector<NextnWeights> nextn;  // [n_nextn]

  // Checks every tensor's presence, shape and type; fails naming the tensor.
  static Weights from_gguf(const gguf::File& f, const ModelConfig& c);
  size_t matrix_bytes() const;  // bytes of the trunk's matrices (what a decode step reads)
};

// Every matrix a layer may have (absent ones have n_out 0); L: LayerWeights, const or not.
template <class L>
auto layer_matrices(L& l) {
  return std::array{&l.wq,   &l.wk,      &l.wv,    &l.wo,       &l.gate,      &l.up,
                    &l.down, &l.ssm_qkv, &l.ssm_z, &l.ssm_beta, &l.ssm_alpha, &l.ssm_out};
}

// The matrices a device's place_weights copies, in its order (the output matrix unless tied);
// W: Weights, const or not.
template <class W>
auto placed_matrices(W& w) {
  std::vector<decltype(&w.output)> m{&w.tok_embd};
  if (w.output.data != w.tok_embd.data) m.push_back(&w.output);
  for (auto& l : w.layers)
    for (auto* x : layer_matrices(l))
      if (x->n_out > 0) m.push_back(x);
  return m;
}

}  // namespace kvs
