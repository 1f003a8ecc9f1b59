// The CUDA backend's copies of models' weights (CudaDevice::place_weights): per model, the
// matrices repacked into the layout of layout.h in one allocation, the small vectors in
// another; every model placed on the device (a draft model's and its target's) kept.
#pragma once

#include <array>
#include <unordered_map>
#include <vector>

#include "kvs/backend/device.h"
#include "kvs/model/weights.h"

namespace kvs::cuda {

struct PlacedWeights {
  std::vector<DeviceBuffer> buffers;
  // The vectors keep their host addresses in Weights, mapped here to their device copies.
  std::unordered_map<const float*, const float*> vectors_at;
};

// Every matrix a layer may have (absent ones have n_out 0); L: LayerWeights, const or not.
template <class L>
auto layer_matrices(L& l) {
  return std::array{&l.wq,   &l.wk,      &l.wv,    &l.wo,       &l.gate,      &l.up,
                    &l.down, &l.ssm_qkv, &l.ssm_z, &l.ssm_beta, &l.ssm_alpha, &l.ssm_out};
}

// The matrices place_weights copies to the device, in its order (the output matrix unless
// tied); W: Weights, const or not.
template <class W>
auto placed_matrices(W& w) {
  std::vector<decltype(&w.output)> m{&w.tok_embd};
  if (w.output.data != w.tok_embd.data) m.push_back(&w.output);
  for (auto& l : w.layers)
    for (auto* x : layer_matrices(l))
      if (x->n_out > 0) m.push_back(x);
  return m;
}

// The weights as the kernels read them, allocated on dev into `placed`. Refuses Gated DeltaNet
// layers of a shape without kernels before allocating anything.
Weights place_weights(Device& dev, const Weights& host, PlacedWeights& placed);
// The bytes place_weights allocates for `host`.
size_t placed_bytes(const Weights& host);

}  // namespace kvs::cuda
