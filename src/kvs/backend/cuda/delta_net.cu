// Gated DeltaNet on CUDA (qwen35's recurrent layers), a sequence in three launches: the causal
// conv with silu (a thread per channel and 16 tokens; the tail moved on), the delta rule, and
// the gated RMSNorm of each value head's output. The delta rule goes token by token (decode: a
// warp keeps 4 rows of a head's state in registers over the call's tokens, so the state is read
// and written once) or a chunk at a time (prefill, in two launches: every chunk's WY form at
// once, then the state carried through the chunks in slices of its value rows; the products on
// tensor cores with tf32 inputs and f32 accumulation, the rounding the prefill's f16 matmuls
// already have; Q K^T in split tf32, near f32, since its rounding alone would be most of the
// chunk's error). q and k are L2-normalized, and the gates computed, where the delta rule reads
// them.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kvs/backend/cuda/delta_net.cuh"

namespace kvs::cuda {

bool delta_net_shape(int64_t head, int64_t taps) {
  return (head == 32 || head == 64 || head == 128) && taps >= 2 && taps <= kMaxTaps;
}

bool delta_net_chunked(const Ctx& c, int32_t head) {
  size_t bytes = 0;
  dispatch_head(head,
                [&]<int S>() { bytes = std::max(SliceSmem<S>::bytes, IntraSmem<S>::bytes); });
  return bytes <= c.smem_optin;
}

size_t delta_net_scratch(int64_t n_tok, int64_t conv_dim, int64_t v_heads) {
  // Records sized for the largest head (the call's head is not known here).
  const int64_t chunks = (n_tok + kChunk - 1) / kChunk;
  return static_cast<size_t>(n_tok * conv_dim + chunks * v_heads * Rec<128>::floats) *
         sizeof(float);
}

void gated_delta_net(Ctx& c, const DeltaNetArgs& a) {
  KVS_CHECK(delta_net_shape(a.head, a.conv) && a.n_tok > 0 && a.k_heads > 0 &&
                a.v_heads % a.k_heads == 0 && a.chunk <= kChunk,
            "cuda gated_delta_net: ", a.n_tok, " tokens, ", a.conv, " taps, ", a.k_heads,
            " key and ", a.v_heads, " value heads of ", a.head, ", chunks of ", a.chunk,
            " (heads of 32, 64 or 128, 2 to ", kMaxTaps, " taps, chunks of at most ", kChunk, ")");
  const int C = a.conv_dim();
  const bool chunked = a.chunk > 1 && delta_net_chunked(c, a.head);
  const int chunks = chunked ? (a.n_tok + a.chunk - 1) / a.chunk : 0;
  // The conv's rows, then each chunk's record.
  size_t rec = 0;
  dispatch_head(a.head, [&]<int S>() { rec = Rec<S>::floats; });
  const size_t conv_floats = static_cast<size_t>(a.n_tok) * C;
  float* conv = c.scratch_gdn(conv_floats + static_cast<size_t>(chunks) * a.v_heads * rec);
  dispatch_taps(a.conv, [&]<int K>() {
    const dim3 grid((C + 127) / 128, (a.n_tok + kConvTok - 1) / kConvTok);
    launch(conv_k<K>, grid, 128, 0, c.stream, a.qkv, a.conv_state, a.conv_w, conv, a.n_tok, C);
  });
  const Gdn g{conv,    a.alpha,   a.beta,    a.dt_bias, a.a,  a.y, a.state, conv + conv_floats,
              a.n_tok, a.k_heads, a.v_heads, a.chunk,   a.eps};
  const int rows = a.n_tok * a.v_heads;
  dispatch_head(a.head, [&]<int S>() {
    if (chunked) {
      allow_smem(intra_k<S>, IntraSmem<S>::bytes);
      launch(intra_k<S>, dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(a.v_heads)),
             kChunkThreads, IntraSmem<S>::bytes, c.stream, g);
      allow_smem(slices_k<S>, SliceSmem<S>::bytes);
      launch(slices_k<S>, dim3(S / kSlice, static_cast<unsigned>(a.v_heads)), kChunkThreads,
             SliceSmem<S>::bytes, c.stream, g);
    } else {
      launch(tokens_k<S>, dim3(static_cast<unsigned>(a.v_heads), S / (kTokRows * kTokWarps)),
             32 * kTokWarps, 0, c.stream, g);
    }
    launch(norm_k<S>, static_cast<unsigned>((rows + 3) / 4), 128, 0, c.stream, a.y, a.z, a.norm,
           rows, a.eps);
  });
}

#ifdef KVS_TRACE
KVS_TRACE_BIND(trace_bind_delta_net)
#endif

}  // namespace kvs::cuda
