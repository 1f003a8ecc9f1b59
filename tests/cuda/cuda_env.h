// A CUDA device made under environment switches (the backend reads them once, when a device is
// made), which are unset again afterwards.
#pragma once

#include <cstdlib>
#include <memory>
#include <utility>
#include <vector>

#include "kvs/backend/device.h"

namespace kvs::test {

using Env = std::vector<std::pair<const char*, const char*>>;

inline std::unique_ptr<Device> cuda_device_with(const Env& env) {
  for (const auto& [k, v] : env) setenv(k, v, 1);
  auto dev = make_cuda_device(0);
  for (const auto& [k, v] : env) unsetenv(k);
  return dev;
}

}  // namespace kvs::test
