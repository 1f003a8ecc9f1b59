#include "kvs/backend/cuda/backend.h"

#include <cstdlib>
#include <string>

#include "kvs/util/error.h"

namespace kvs {

CudaOptions CudaOptions::from_env() {
  CudaOptions o;
  const auto var = [](const char* name) -> const char* { return std::getenv(name); };
  // A switch: "0" or "1".
  const auto flag = [&](const char* name, bool& v) {
    const char* e = var(name);
    if (!e) return;
    const std::string s = e;
    KVS_CHECK(s == "0" || s == "1", name, "=", s, ": 0 or 1");
    v = s == "1";
  };
  flag("KVS_CUDA_GRAPHS", o.graphs);
  flag("KVS_PDL", o.pdl);
  flag("KVS_PROFILE", o.profile);
  if (const char* e = var("KVS_TRACE")) o.trace = e;
  if (const char* e = var("KVS_DECODE_WARP")) {
    const std::string s = e;
    KVS_CHECK(s == "0" || s == "1", "KVS_DECODE_WARP=", s,
              ": 0 (a block per span) or 1 (a warp per span)");
    o.decode_split = s == "1" ? DecodeSplit::WarpPerSpan : DecodeSplit::BlockPerSpan;
  }
  if (const char* e = var("KVS_L2_NEXT")) {
    const std::string s = e;
    char* end = nullptr;
    const long mib = std::strtol(e, &end, 10);
    KVS_CHECK(!s.empty() && *end == '\0' && mib >= 0 && mib <= 64, "KVS_L2_NEXT=", s,
              ": MiB of the next product's weights (0-64)");
    o.l2_next_mib = static_cast<int>(mib);
  }
  return o;
}

}  // namespace kvs
