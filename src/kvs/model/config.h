// The shape of a model, read from GGUF metadata: everything the forward pass needs to know
// besides the weights themselves.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvs {
namespace gguf {
class File;
}

enum class Arch { Llama, Qwen2, Qwen3, Gemma3, Qwen35 };
// What a layer keeps per sequence. Full: every position's K and V in pages (resident or
// streamed); Window: the K and V of the last n_swa positions, always resident, pages recycled as
// the window moves; Recurrent: a fixed-size state (qwen35's Gated DeltaNet layers: a conv tail
// and a delta-rule state per sequence).
enum class LayerKind : uint8_t { Full, Window, Recurrent };
// The FFN's gated activation: silu(gate) * up (SwiGLU) or gelu_tanh(gate) * up (GeGLU).
enum class Activation { SiLU, GeluTanh };
// NORM rotates interleaved pairs (x[2i], x[2i+1]) (llama's permuted Q/K); NEOX rotates
// (x[i], x[i + d/2]) (qwen; qwen35's multi-section rope is NEOX for text, its sections checked).
enum class RopeMode { Norm, Neox };

struct ModelConfig {
  Arch arch = Arch::Llama;
  std::string arch_name;  // general.architecture
  std::string name;       // general.name, for display
  int32_t n_layer = 0;
  int32_t n_embd = 0;
  int32_t n_ff = 0;
  int32_t n_head = 0;
  int32_t n_head_kv = 0;
  int32_t head_dim = 0;
  int32_t n_vocab = 0;
  int32_t n_ctx_train = 0;
  float norm_eps = 1e-5f;
  RopeMode rope_mode = RopeMode::Norm;
  int32_t rope_dim = 0;  // leading dims of each head that are rotated
  float rope_base = 10000.0f;
  float rope_linear_scale = 1.0f;  // positions are divided by this ("linear" scaling)
  bool has_rope_freqs = false;     // rope_freqs.weight divides the frequencies (llama 3.1)
  bool qkv_bias = false;           // qwen2
  bool qk_norm = false;            // qwen3: RMSNorm of each q/k head before rope
  bool tied_embeddings = false;    // no output.weight: the token embedding is the output
  std::vector<LayerKind> kinds;    // [n_layer]
  int32_t n_swa = 0;               // Window layers: a query at p sees keys p - n_swa + 1 .. p
  float rope_base_swa = 10000.0f;  // Window layers' rope base (no scaling, no factors)
  Activation act = Activation::SiLU;
  bool post_norms = false;  // gemma3: RMSNorm of the attention and FFN outputs before the add
  float embd_scale = 1.0f;  // gemma3: the embedding rows times sqrt(n_embd)
  float attn_scale = 0.0f;  // the scores' scale (1/sqrt(head_dim) unless the model says)
  // qwen35: attn_q gives [q, gate] per head (2 * head_dim rows each) and the heads' output is
  // multiplied by sigmoid(gate); the layer's post_attention_norm is the FFN's pre-norm.
  bool attn_gate = false;
  // qwen35's Gated DeltaNet (Recurrent layers): ssm_k_heads key heads and ssm_v_heads value
  // heads, both of ssm_state; value head h reads key head h % ssm_k_heads; a causal conv of
  // ssm_conv taps over the projected [q, k, v] rows.
  int32_t ssm_conv = 0;
  int32_t ssm_state = 0;
  int32_t ssm_k_heads = 0;
  int32_t ssm_v_heads = 0;
  // qwen35: MTP blocks after the trunk in the file (blk.n_layer ..), loaded, never run.
  int32_t n_nextn = 0;

  int32_t q_dim() const { return n_head * head_dim; }
  int32_t kv_dim() const { return n_head_kv * head_dim; }
  int32_t n_layers_of(LayerKind k) const;
  int32_t ssm_key_dim() const { return ssm_k_heads * ssm_state; }
  int32_t ssm_value_dim() const { return ssm_v_heads * ssm_state; }
  int32_t ssm_conv_dim() const { return 2 * ssm_key_dim() + ssm_value_dim(); }  // [q, k, v]

  // Reads and checks the metadata; fails naming the key or the unsupported architecture.
  static ModelConfig from_gguf(const gguf::File& f);
};

const char* arch_name(Arch a);

}  // namespace kvs
