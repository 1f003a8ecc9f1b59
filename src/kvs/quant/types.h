// Tensor element types: the GGML type ids as they appear in GGUF files, their block layouts,
// and the CPU reference kernels per format (dequantize, quantize).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvs {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
};

struct DTypeTraits {
  const char* name;  // lower case, as llama.cpp prints it ("q4_k", "f16")
  uint32_t block;    // elements per block
  uint32_t block_bytes;
  bool supported;  // kvstream can compute with it (dequantize and dot)
};

// Traits of a type id read from a file; nullptr for an id that GGML does not define.
const DTypeTraits* dtype_traits(uint32_t id);
const DTypeTraits& traits(DType t);  // t must be a defined id
inline const char* dtype_name(DType t) {
  return traits(t).name;
}
// Bytes of a row of n elements; fails (kvs::Error) when n is not a multiple of the block.
size_t row_bytes(DType t, int64_t n);
// "q4_0", "Q4_0", "f16", ... -> DType; fails naming `what` and listing the accepted names.
DType parse_dtype(std::string_view name, std::string_view what);
bool is_supported(DType t);
// "f32, f16, q4_0, ...": the names of the supported types, for error messages.
std::string supported_dtype_names();

// Reference CPU kernels. n is a multiple of the type's block size.
// y[0..n) = dequantized x.
void dequantize_row(DType t, const void* x, float* y, int64_t n);
// y[0..32 nb) = nb q4_0 or q8_0 blocks whose f16 scales (scales[0..2 nb)) are stored apart from
// their quants (quants, 16 or 32 bytes a block), as a KV head slice keeps them; the values
// dequantize_row gives for the same blocks.
void dequantize_split(DType t, const uint8_t* scales, const uint8_t* quants, float* y, int64_t nb);
// Quantizes y into t's blocks (round to nearest, as ggml's reference quantizers do).
void quantize_row(DType t, const float* x, void* y, int64_t n);

}  // namespace kvs
