// NumPy .npy files (format 1.0, little endian, C order): float32 logits out, arrays in for tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvs {

void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape);

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> data;  // converted to float32 from <f4, <f8, <i4, <i8
};
NpyArray read_npy(const std::string& path);

}  // namespace kvs
