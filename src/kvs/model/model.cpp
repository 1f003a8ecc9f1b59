#include "kvs/model/model.h"

#include "kvs/model/synthetic.h"

namespace kvs {

std::unique_ptr<Model> Model::load(const std::string& spec) {
  auto m = std::make_unique<Model>();
  constexpr std::string_view kSynth = "synthetic:";
  if (spec.rfind(kSynth, 0) == 0)
    m->file = make_synthetic(std::string_view(spec).substr(kSynth.size()));
  else
    m->file = gguf::File::open(spec);
  m->config = ModelConfig::from_gguf(*m->file);
  m->weights = Weights::from_gguf(*m->file, m->config);
  m->tokenizer = Tokenizer::from_gguf(*m->file);
  return m;
}

}  // namespace kvs
