// CPU kernels of the forward pass, vectorised with AVX2/FMA and run on all cores through the
// thread pool. Every result is a fixed sequence of float operations per output element,
// independent of how the work is split, so batch sizes and residency never change the numbers.
#pragma once

#include "kvs/backend/cpu/host_attention.h"  // kv_write, attention
#include "kvs/backend/cpu/quant_dot.h"
#include "kvs/backend/device.h"

namespace kvs::cpu {

void embed(const Matrix& emb, const int32_t* ids, int32_t n, float* x);
void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps);
// The jobs' y[t] (+)= W x[t] (+ bias) for x [n_tok][n_in]; xq: x quantized by quantize_x, used
// for the weights where has_int_dot (null: every job in float).
void matmuls(const float* x, const XGroup* xq, int64_t n_tok, const MatJob* jobs, int n_jobs);
// y[t] = W x[t] (+ bias) in float (the weights dequantized).
void matmul_f32(const Matrix& w, const float* x, float* y, int64_t n_tok, const float* bias);
void rope(float* x, const int32_t* pos, int32_t n_tok, int32_t n_head, const RopeParams& p);
void swiglu(float* gate, const float* up, int64_t n);
void geglu(float* gate, const float* up, int64_t n);
void sigmoid_mul(float* x, const float* gate, int64_t n);
void scale(float* x, float s, int64_t n);
void add(float* x, const float* y, int64_t n);
void gated_delta_net(const DeltaNetArgs& a);  // delta_net.cpp

}  // namespace kvs::cpu
