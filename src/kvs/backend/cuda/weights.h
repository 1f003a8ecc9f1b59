// The CUDA backend's copies of models' weights (CudaDevice::place_weights): per model, the
// matrices repacked into the layout of layout.h in one allocation, the small vectors in
// another; every model placed on the device (a draft model's and its target's) kept.
#pragma once

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

// The weights as the kernels read them, allocated on dev into `placed`. Refuses Gated DeltaNet
// layers of a shape without kernels before allocating anything.
Weights place_weights(Device& dev, const Weights& host, PlacedWeights& placed);
// The bytes place_weights allocates for `host`.
size_t placed_bytes(const Weights& host);

}  // namespace kvs::cuda
