// Scalar reference kernels: ggml's formulas written out plainly, one loop per format. The tests
// hold the vectorised kernels (types.h) to these, bit for bit, and these to gguf-py.
#pragma once

#include <cstdint>

#include "kvs/quant/types.h"

namespace kvs {

void dequantize_row_ref(DType t, const void* x, float* y, int64_t n);
// Same results as quantize_row (the fast paths of quantize_row are bit exact to these).
void quantize_row_ref(DType t, const float* x, void* y, int64_t n);

}  // namespace kvs
