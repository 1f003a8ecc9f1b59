// Weights placement on the GPU (weights.h).
#include "kvs/backend/cuda/weights.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kvs/backend/cuda/common.cuh"
#include "kvs/backend/cuda/kernels.h"
#include "kvs/backend/cuda/layout.h"
#include "kvs/util/threadpool.h"

namespace kvs::cuda {

namespace {

template <class W>
auto placed_vectors(W& w) {
  std::vector<decltype(&w.output_norm)> v{&w.output_norm, &w.rope_freqs};
  for (auto& l : w.layers)
    for (auto* x : {&l.attn_norm, &l.bq, &l.bk, &l.bv, &l.q_norm, &l.k_norm, &l.attn_post_norm,
                    &l.ffn_norm, &l.ffn_post_norm, &l.ssm_conv1d, &l.ssm_dt, &l.ssm_a, &l.ssm_norm})
      v.push_back(x);
  return v;
}

size_t matrix_bytes(const Weights& w) {
  size_t n = 0;
  for (const Matrix* m : placed_matrices(w))
    n += (device_pitch(m->type, m->n_in) * static_cast<size_t>(m->n_out) + 255) / 256 * 256;
  return n;
}

// Each vector's floats start at a multiple of 64.
size_t vector_bytes(const Weights& w) {
  size_t n = 0;
  for (const Vec* v : placed_vectors(w)) n += (v->size() + 63) / 64 * 64;
  return std::max<size_t>(n, 1) * sizeof(float);
}

}  // namespace

size_t placed_bytes(const Weights& host) { return matrix_bytes(host) + vector_bytes(host); }

Weights place_weights(Device& dev, const Weights& host, PlacedWeights& placed) {
  for (size_t il = 0; il < host.layers.size(); ++il) {
    const LayerWeights& l = host.layers[il];
    if (l.ssm_qkv.n_out == 0) continue;
    const int64_t head = static_cast<int64_t>(l.ssm_norm.size());
    const int64_t taps = static_cast<int64_t>(l.ssm_conv1d.size()) / l.ssm_qkv.n_out;
    KVS_CHECK(delta_net_shape(head, taps), "cuda: layer ", il, "'s Gated DeltaNet has heads of ",
              head, " and a conv of ", taps,
              " taps; the CUDA kernels take heads of 32, 64 or 128 and 2 to 4 taps (run this "
              "model on the cpu backend)");
  }
  Weights out = host;
  const std::vector<Matrix*> mats = placed_matrices(out);
  // Rows are repacked on the host into the layout of layout.h.
  std::vector<size_t> pitch(mats.size());
  for (size_t i = 0; i < mats.size(); ++i) pitch[i] = device_pitch(mats[i]->type, mats[i]->n_in);
  uint8_t* const base = placed.buffers.emplace_back(dev.alloc(matrix_bytes(host), "the weights")).as();
  std::vector<uint8_t> buf;
  size_t off = 0;
  for (size_t i = 0; i < mats.size(); ++i) {
    Matrix* m = mats[i];
    const int64_t rows_per =
        std::max<int64_t>(1, static_cast<int64_t>((size_t{64} << 20) / pitch[i]));
    for (int64_t r0 = 0; r0 < m->n_out; r0 += rows_per) {
      const int64_t nr = std::min(rows_per, m->n_out - r0);
      buf.resize(static_cast<size_t>(nr) * pitch[i]);
      thread_pool().parallel_for(nr, 64, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r)
          pack_row(m->type, m->row(r0 + r), buf.data() + static_cast<size_t>(r) * pitch[i], m->n_in,
                   pitch[i]);
      });
      KVS_CUDA_CHECK(cudaMemcpy(base + off + static_cast<size_t>(r0) * pitch[i],
                                buf.data(), buf.size(), cudaMemcpyHostToDevice));
    }
    m->data = base + off;
    m->row_bytes = pitch[i];
    off += (pitch[i] * static_cast<size_t>(m->n_out) + 255) / 256 * 256;
  }
  if (host.output.data == host.tok_embd.data) out.output = out.tok_embd;  // tied: same layout too
  const std::vector<Vec*> vecs = placed_vectors(out);
  float* const vbase =
      placed.buffers.emplace_back(dev.alloc(vector_bytes(host), "the weights' vectors")).as<float>();
  size_t vo = 0;
  for (Vec* v : vecs) {
    if (v->empty()) continue;
    float* d = vbase + vo;
    KVS_CUDA_CHECK(cudaMemcpy(d, v->data(), v->size() * sizeof(float), cudaMemcpyHostToDevice));
    placed.vectors_at[v->data()] = d;
    vo += (v->size() + 63) / 64 * 64;
  }
  return out;
}

}  // namespace kvs::cuda
