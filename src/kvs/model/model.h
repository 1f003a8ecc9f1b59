// A loaded model: the file (mapped or in memory), its config, weight views and tokenizer.
#pragma once

#include <memory>
#include <string>

#include "kvs/gguf/gguf.h"
#include "kvs/model/config.h"
#include "kvs/model/weights.h"
#include "kvs/tokenizer/tokenizer.h"

namespace kvs {

struct Model {
  std::unique_ptr<gguf::File> file;  // owns the bytes the weight views point into
  ModelConfig config;
  Weights weights;
  std::unique_ptr<Tokenizer> tokenizer;

  // `spec` is a .gguf path or "synthetic:PRESET[:TYPE]".
  static std::unique_ptr<Model> load(const std::string& spec);
};

}  // namespace kvs
