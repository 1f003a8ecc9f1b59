// How the CUDA backend runs: what it records, and the features that can be switched off to
// compare against and for the tests that hold them to the same bits. Plain data, given to
// make_cuda_device; from_env() reads the KVS_* environment variables the scripts set.
#pragma once

#include <string>

namespace kvs {

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

}  // namespace kvs
