// What the engine and the apps see of the CUDA backend: how it runs (CudaOptions), the device
// itself, and its sizes, known without a GPU. Plain C++: a CPU build includes it too (kvstream
// plan, the options' checks), and the kvs_cuda library defines what it declares.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "kvs/backend/device.h"

namespace kvs {

// What it records, and the features that can be switched off to compare against and for the
// tests that hold them to the same bits. Plain data, given to make_cuda_device; from_env()
// reads the KVS_* environment variables the scripts set.
struct CudaOptions {
  // How decode attention splits its work: by the context's length, or forced.
  enum class DecodeSplit { Auto, BlockPerSpan, WarpPerSpan };

  bool graphs = true;   // KVS_CUDA_GRAPHS=0: every operation launched on its own, no graphs
  bool pdl = true;      // KVS_PDL=0: no programmatic dependent launch (sm_90 and later have it)
  bool profile = false;  // KVS_PROFILE=1: each operation's GPU time, printed at exit (no graphs)
  std::string trace;     // KVS_TRACE=FILE: a timing build's block times written there
  DecodeSplit decode_split = DecodeSplit::Auto;  // KVS_DECODE_WARP=0: a block per span, 1: a warp
  int l2_next_mib = 4;  // KVS_L2_NEXT=MiB (0-64) of the next product's weights L2 fetches

  // The options as the environment sets them (unset: the defaults above); throws Error on a
  // value it does not know.
  static CudaOptions from_env();
  bool operator==(const CudaOptions&) const = default;
};

// The CUDA device (builds with KVS_HAVE_CUDA); capacity 0 means the GPU's free memory.
std::unique_ptr<Device> make_cuda_device(size_t capacity, const CudaOptions& opt);

// Steps of up to this many tokens (all sequences' together) are batch-invariant on CUDA: each
// token's logits are the bits of a step of it alone (its Device::Caps::invariant_tokens; the
// apps check flags against it before a device exists).
constexpr int kCudaInvariantTokens = 16;

// What a CUDA device holds for an engine beside its KV pool, found without a GPU (kvstream
// plan): the weights as place_weights lays them out, and reserve()'s and prefill_scratch()'s
// bytes for `a`.
struct CudaFootprint {
  size_t weights = 0, reserved = 0, workspace = 0;
};
CudaFootprint cuda_footprint(const Weights& w, const ScratchArgs& a);

}  // namespace kvs
