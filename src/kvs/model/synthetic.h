// Synthetic models: random weights (deterministic seed) with the exact shape of a real model,
// built in memory as a GGUF image, so benchmarks and tests run without downloading weights.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kvs {
namespace gguf {
class File;
class Writer;
}  // namespace gguf
struct ModelConfig;

// spec = "PRESET[:WEIGHT_TYPE]", e.g. "llama3-8b:q4_0". Fails listing the presets and types.
// values false: the matrices are zeros (never generated; a written file is sparse there).
gguf::Writer synthetic_writer(std::string_view spec, bool values = true);
std::unique_ptr<gguf::File> make_synthetic(std::string_view spec);
std::vector<std::string> synthetic_presets();
// The config a synthetic model of `spec` has, without building its weights (for tests and
// sizing); equal to ModelConfig::from_gguf(*make_synthetic(spec)).
ModelConfig synthetic_config(std::string_view spec);
// The model of `spec` with every matrix zero and no vocabulary, built at once in memory it
// does not touch: its shapes and sizes, for sizing (kvstream plan).
std::unique_ptr<gguf::File> synthetic_shapes(std::string_view spec);

}  // namespace kvs
