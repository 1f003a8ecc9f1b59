// Views of a model's weights. Matrices stay in their file format (the kernels dequantize them
// in tiles); the small vectors (norms, biases, rope factors) are converted to f32 at load.
#pragma once

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

struct LayerWeights {
  Vec attn_norm;          // [n_embd]
  Matrix wq, wk, wv, wo;  // [q_dim x n_embd], [kv_dim x n_embd] x2, [n_embd x q_dim]
  Vec bq, bk, bv;         // qwen2 biases [q_dim], [kv_dim], [kv_dim]
  Vec q_norm, k_norm;     // qwen3, gemma3 [head_dim]
  Vec attn_post_norm;     // gemma3 [n_embd]
  Vec ffn_norm;           // [n_embd]
  Matrix gate, up, down;  // [n_ff x n_embd] x2, [n_embd x n_ff]
  Vec ffn_post_norm;      // gemma3 [n_embd]
};

struct Weights {
  Matrix tok_embd;  // [n_vocab x n_embd]
  Vec output_norm;  // [n_embd]
  Matrix output;    // [n_vocab x n_embd]; the embedding when tied
  Vec rope_freqs;   // [rope_dim / 2], empty when absent
  std::vector<LayerWeights> layers;

  // Checks every tensor's presence, shape and type; fails naming the tensor.
  static Weights from_gguf(const gguf::File& f, const ModelConfig& c);
  size_t matrix_bytes() const;  // bytes of all matrices (what a decode step reads)
};

}  // namespace kvs
