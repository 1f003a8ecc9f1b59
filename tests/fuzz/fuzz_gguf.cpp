// libFuzzer: arbitrary bytes as a GGUF image, read as kvstream reads a model file: the header,
// metadata and tensor table, the model's config and its tokenizer. Every malformed input must
// end in kvs::Error (a message naming what is wrong), never a crash, a hang or a wild read.
#include <cstdint>
#include <vector>

#include "kvs/gguf/gguf.h"
#include "kvs/model/config.h"
#include "kvs/tokenizer/tokenizer.h"
#include "kvs/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto f = kvs::gguf::File::from_buffer(std::vector<uint8_t>(data, data + size), "fuzz.gguf");
    for (const auto& t : f->tensors()) (void)t.rows();
    (void)kvs::ModelConfig::from_gguf(*f);
    auto tok = kvs::Tokenizer::from_gguf(*f);
    (void)tok->encode("Hello, world! 123 <|im_start|>", true, true);
  } catch (const kvs::Error&) {
  }
  return 0;
}
