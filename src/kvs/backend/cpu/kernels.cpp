#include "kvs/backend/cpu/kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kvs/quant/simd.h"
#include "kvs/util/error.h"
#include "kvs/util/threadpool.h"

namespace kvs::cpu {
namespace {

using quant::hsum;

// One dot product: lanes accumulate k in steps of 8, then a fixed horizontal sum, then the
// scalar tail. Every blocked kernel below performs exactly this sequence per output.
inline float dot(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc);
  float s = hsum(acc);
  for (; k < n; ++k) s = std::fma(a[k], b[k], s);
  return s;
}

// 4 rows x 2 tokens, same per-output arithmetic as dot().
inline void dot4x2(const float* w, int64_t ld, const float* x0, const float* x1, int64_t n,
                   float out[4][2]) {
  __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00,
         a30 = a00, a31 = a00;
  const float *w0 = w, *w1 = w + ld, *w2 = w + 2 * ld, *w3 = w + 3 * ld;
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    __m256 u = _mm256_loadu_ps(x0 + k), v = _mm256_loadu_ps(x1 + k);
    __m256 r = _mm256_loadu_ps(w0 + k);
    a00 = _mm256_fmadd_ps(r, u, a00);
    a01 = _mm256_fmadd_ps(r, v, a01);
    r = _mm256_loadu_ps(w1 + k);
    a10 = _mm256_fmadd_ps(r, u, a10);
    a11 = _mm256_fmadd_ps(r, v, a11);
    r = _mm256_loadu_ps(w2 + k);
    a20 = _mm256_fmadd_ps(r, u, a20);
    a21 = _mm256_fmadd_ps(r, v, a21);
    r = _mm256_loadu_ps(w3 + k);
    a30 = _mm256_fmadd_ps(r, u, a30);
    a31 = _mm256_fmadd_ps(r, v, a31);
  }
  float s[4][2] = {{hsum(a00), hsum(a01)},
                   {hsum(a10), hsum(a11)},
                   {hsum(a20), hsum(a21)},
                   {hsum(a30), hsum(a31)}};
  const float* ws[4] = {w0, w1, w2, w3};
  for (int r = 0; r < 4; ++r)
    for (int64_t kk = k; kk < n; ++kk) {
      s[r][0] = std::fma(ws[r][kk], x0[kk], s[r][0]);
      s[r][1] = std::fma(ws[r][kk], x1[kk], s[r][1]);
    }
  for (int r = 0; r < 4; ++r) out[r][0] = s[r][0], out[r][1] = s[r][1];
}

// 4 rows x 1 token (decode), same per-output arithmetic as dot(): the rows' chains interleaved.
inline void dot4x1(const float* w, int64_t ld, const float* x, int64_t n, float out[4]) {
  __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                 _mm256_setzero_ps()};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m256 u = _mm256_loadu_ps(x + k);
    for (int r = 0; r < 4; ++r) a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(w + r * ld + k), u, a[r]);
  }
  for (int r = 0; r < 4; ++r) {
    float s = hsum(a[r]);
    for (int64_t kk = k; kk < n; ++kk) s = std::fma(w[r * ld + kk], x[kk], s);
    out[r] = s;
  }
}

std::vector<float>& scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf;
}

}  // namespace

void embed(const Matrix& emb, const int32_t* ids, int32_t n, float* x) {
  for (int32_t t = 0; t < n; ++t) {
    KVS_CHECK(ids[t] >= 0 && ids[t] < emb.n_out, "token id ", ids[t], " is out of range (vocab ",
              emb.n_out, ")");
    const uint8_t* row = emb.row(ids[t]);
    if (cpu_repacked(emb.type)) {  // placed in the CPU layout: the file's row back first
      thread_local std::vector<uint8_t> file;
      file.resize(row_bytes(emb.type, emb.n_in));
      unpack_row(emb.type, row, file.data(), emb.n_in);
      row = file.data();
    }
    dequantize_row(emb.type, row, x + t * emb.n_in, emb.n_in);
  }
}

void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps) {
  thread_pool().parallel_for(rows, 8, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* xr = x + r * n;
      float* yr = y + r * n;
      float ss = dot(xr, xr, n);
      float s = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
      for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * s * w[i];
    }
  });
}

// f32, f16, bf16 and the integer formats without quantized activations: rows dequantized to
// f32 by tiles, dot products in float.
void matmul_f32(const Matrix& w, const float* x, float* y, int64_t n_tok, const float* bias) {
  const int64_t n = w.n_in, n_out = w.n_out;
  constexpr int64_t kTile = 16;  // weight rows dequantized at once (f32 tile stays in L1/L2)
  const int64_t tiles = (n_out + kTile - 1) / kTile;
  thread_pool().parallel_for(tiles, 1, [&](int64_t tb, int64_t te) {
    std::vector<float>& buf = scratch(static_cast<size_t>(kTile * n));
    for (int64_t tile = tb; tile < te; ++tile) {
      const int64_t r0 = tile * kTile, nr = std::min(kTile, n_out - r0);
      for (int64_t r = 0; r < nr; ++r) dequantize_row(w.type, w.row(r0 + r), buf.data() + r * n, n);
      int64_t t = 0;
      for (; t + 2 <= n_tok; t += 2) {
        const float *x0 = x + t * n, *x1 = x0 + n;
        int64_t r = 0;
        for (; r + 4 <= nr; r += 4) {
          float o[4][2];
          dot4x2(buf.data() + r * n, n, x0, x1, n, o);
          for (int i = 0; i < 4; ++i) {
            y[t * n_out + r0 + r + i] = o[i][0];
            y[(t + 1) * n_out + r0 + r + i] = o[i][1];
          }
        }
        for (; r < nr; ++r) {
          y[t * n_out + r0 + r] = dot(buf.data() + r * n, x0, n);
          y[(t + 1) * n_out + r0 + r] = dot(buf.data() + r * n, x1, n);
        }
      }
      for (; t < n_tok; ++t) {
        int64_t r = 0;
        for (; r + 4 <= nr; r += 4)
          dot4x1(buf.data() + r * n, n, x + t * n, n, y + t * n_out + r0 + r);
        for (; r < nr; ++r) y[t * n_out + r0 + r] = dot(buf.data() + r * n, x + t * n, n);
      }
      if (bias)
        for (int64_t tt = 0; tt < n_tok; ++tt)
          for (int64_t r = 0; r < nr; ++r) y[tt * n_out + r0 + r] += bias[r0 + r];
    }
  });
}

void matmuls(const float* x, const XGroup* xq, int64_t n_tok, const MatJob* jobs, int n_jobs) {
  // The integer jobs in one parallel region of tasks of kRows rows x kToks tokens: a task's
  // weights stay in L1 and its activations in L2 while it runs, and consecutive tasks (the rows
  // of every job) share the activations.
  constexpr int64_t kRows = 16, kToks = 64;
  constexpr int kMaxJobs = 8;
  KVS_CHECK(n_jobs <= kMaxJobs, "cpu matmuls: ", n_jobs, " jobs (at most ", kMaxJobs, ")");
  int64_t first[kMaxJobs + 1] = {0};  // the jobs' first row chunk
  for (int j = 0; j < n_jobs; ++j) {
    const Matrix& w = *jobs[j].w;
    first[j + 1] = first[j] + (xq && has_int_dot(w.type) ? (w.n_out + kRows - 1) / kRows : 0);
  }
  const int64_t rc = first[n_jobs], tc = (n_tok + kToks - 1) / kToks;
  if (rc > 0) {
    const DotIsa isa = best_dot_isa();
    const int64_t ng = x_groups(jobs[0].w->n_in);
    thread_pool().parallel_for(rc * tc, 1, [&](int64_t b, int64_t e) {
      float buf[kRows * kToks];
      for (int64_t task = b; task < e; ++task) {
        const int64_t c = task % rc, t0 = task / rc * kToks, nt = std::min(kToks, n_tok - t0);
        int j = 0;
        while (c >= first[j + 1]) ++j;
        const MatJob& job = jobs[j];
        const int64_t n_out = job.w->n_out, r0 = (c - first[j]) * kRows;
        const int64_t nr = std::min(kRows, n_out - r0);
        int_matmul_rows(*job.w, xq + t0 * ng, nt, r0, nr, buf, kRows, isa);
        // The product, plus the bias, then into y or added to it: the roundings of separate
        // steps.
        for (int64_t t = 0; t < nt; ++t)
          for (int64_t r = 0; r < nr; ++r) {
            float v = buf[t * kRows + r];
            if (job.bias) v += job.bias[r0 + r];
            float& out = job.y[(t0 + t) * n_out + r0 + r];
            out = job.add ? out + v : v;
          }
      }
    });
  }
  for (int j = 0; j < n_jobs; ++j) {
    if (first[j + 1] > first[j]) continue;
    const MatJob& job = jobs[j];
    if (!job.add) {
      matmul_f32(*job.w, x, job.y, n_tok, job.bias);
      continue;
    }
    // The product first (matmul_f32 takes scratch() for its tiles), then added.
    thread_local std::vector<float> sum;
    const size_t n = static_cast<size_t>(job.w->n_out * n_tok);
    if (sum.size() < n) sum.resize(n);
    matmul_f32(*job.w, x, sum.data(), n_tok, job.bias);
    add(job.y, sum.data(), static_cast<int64_t>(n));
  }
}

void rope(float* x, const int32_t* pos, int32_t n_tok, int32_t n_head, const RopeParams& p) {
  const int32_t half = p.rope_dim / 2;
  // Angles in double: theta_i = pos / scale * base^(-2i/d) / factor_i (the powers once a call).
  thread_local std::vector<double> freq;
  freq.resize(static_cast<size_t>(half));
  for (int32_t i = 0; i < half; ++i)
    freq[i] = std::pow(static_cast<double>(p.base), -2.0 * i / p.rope_dim);
  const double* fr = freq.data();  // the caller's (a worker's thread_local is its own)
  thread_pool().parallel_for(n_tok, 4, [&](int64_t b, int64_t e) {
    std::vector<float>& cs = scratch(static_cast<size_t>(2 * half));
    for (int64_t t = b; t < e; ++t) {
      const double ppos = static_cast<double>(pos[t]) / static_cast<double>(p.linear_scale);
      for (int32_t i = 0; i < half; ++i) {
        double th = ppos * fr[i];
        if (p.freq_factors) th /= static_cast<double>(p.freq_factors[i]);
        cs[2 * i] = static_cast<float>(std::cos(th));
        cs[2 * i + 1] = static_cast<float>(std::sin(th));
      }
      for (int32_t h = 0; h < n_head; ++h) {
        float* v = x + (t * n_head + h) * p.head_dim;
        for (int32_t i = 0; i < half; ++i) {
          const int32_t a = p.mode == RopeMode::Norm ? 2 * i : i;
          const int32_t c = p.mode == RopeMode::Norm ? 2 * i + 1 : i + half;
          const float x0 = v[a], x1 = v[c], co = cs[2 * i], si = cs[2 * i + 1];
          v[a] = x0 * co - x1 * si;
          v[c] = x0 * si + x1 * co;
        }
      }
    }
  });
}

void sigmoid_mul(float* x, const float* gate, int64_t n) {
  thread_pool().parallel_for(n, 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) x[i] = x[i] / (1.0f + std::exp(-gate[i]));
  });
}

void swiglu(float* gate, const float* up, int64_t n) {
  // g / (1 + e^-g) * up, 8 at a time (e^x by exp_ps), the last few through a copy: the same
  // steps for every element.
  const auto eight = [](float* g8, const float* u8) {
    const __m256 g = _mm256_loadu_ps(g8);
    const __m256 den =
        _mm256_add_ps(_mm256_set1_ps(1.0f), quant::exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), g)));
    _mm256_storeu_ps(g8, _mm256_mul_ps(_mm256_div_ps(g, den), _mm256_loadu_ps(u8)));
  };
  thread_pool().parallel_for(n, 4096, [&](int64_t b, int64_t e) {
    int64_t i = b;
    for (; i + 8 <= e; i += 8) eight(gate + i, up + i);
    if (i < e) {
      float g8[8] = {}, u8[8] = {};
      std::copy(gate + i, gate + e, g8);
      std::copy(up + i, up + e, u8);
      eight(g8, u8);
      std::copy(g8, g8 + (e - i), gate + i);
    }
  });
}

void geglu(float* gate, const float* up, int64_t n) {
  constexpr float kC = 0.7978845608028654f;  // sqrt(2 / pi)
  thread_pool().parallel_for(n, 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float g = gate[i];
      gate[i] = 0.5f * g * (1.0f + std::tanh(kC * (g + 0.044715f * g * g * g))) * up[i];
    }
  });
}

void scale(float* x, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void add(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void kv_write(const KvLayout& l, const float* k, const float* v, int32_t n_tok,
              uint8_t* const* pages, const int32_t* slots) {
  const int32_t d = l.head_dim;
  const int64_t dim = int64_t{l.n_head_kv} * d;
  thread_pool().parallel_for(n_tok, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      uint8_t* kr = pages[t] + static_cast<size_t>(slots[t]) * l.k_row;
      uint8_t* vr = pages[t] + l.v_offset() + static_cast<size_t>(slots[t]) * l.v_row;
      for (int32_t h = 0; h < l.n_head_kv; ++h) {
        kv_quantize_head(l.k_type, k + t * dim + h * d, kr + h * l.k_head, d);
        kv_quantize_head(l.v_type, v + t * dim + h * d, vr + h * l.v_head, d);
      }
    }
  });
}

}  // namespace kvs::cpu
