// Where the tests find the binary, the Python reference and the models. The build compiles
// the paths in; environment variables of the same names (KVS_BINARY, ...) override them.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

#include <unistd.h>

namespace kvs::test {

inline std::string env_or(const char* name, const char* def) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : def;
}
inline std::string source_dir() {
  return env_or("KVS_SOURCE_DIR", KVS_TEST_SOURCE_DIR);
}
inline std::string binary() {
  return env_or("KVS_BINARY", KVS_TEST_BINARY);
}
inline std::string python() {
  return env_or("KVS_PYTHON", KVS_TEST_PYTHON);
}
inline std::string model_dir() {
  return env_or("KVS_MODEL_DIR", KVS_TEST_MODEL_DIR);
}
inline std::string smollm2() {
  return model_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}
inline std::string gemma3_270m() {
  return model_dir() + "/gemma-3-270m-q4_k_m.gguf";
}

// A fresh directory for one test's files, removed by the test harness' temp cleaning.
inline std::filesystem::path temp_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() /
           ("kvs_" + name + "_" + std::to_string(static_cast<long>(::getpid())));
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace kvs::test
