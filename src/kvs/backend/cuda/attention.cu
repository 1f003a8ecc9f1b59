// Attention over spans, continuing a running state (max, sum, unnormalised output) across
// calls exactly as the CPU kernel does, so a run that sees its spans in several calls (the
// ring's chunks) computes the same operations as one that sees them at once. One token's query
// (decode) goes to attention_decode.cu and attention_decode_tc.cu, several tokens' (prefill)
// to attention_prefill.cu; the code they share is in attention_tile.cuh.
#include "kvs/backend/cuda/attention_tile.cuh"

namespace kvs::cuda {

namespace {

// The call as the kernels see it.
Geo geo_of(const AttentionArgs& a, uint8_t* xq) {
  const KvLayout& l = a.kv;
  const int d = l.head_dim, P = l.page_size;
  KVS_CHECK(d == 32 || d == 64 || d == 128 || d == 256, "cuda attention: head size ", d,
            " (32, 64, 128 or 256)");
  KVS_CHECK(P <= 2048, "cuda attention: --page-size ", P, " is above 2048");
  Geo g{a.q,       a.out,    a.acc,
        a.spans,   a.pos,    a.n_tok,
        a.n_spans, a.n_head, a.n_head / l.n_head_kv,
        d,         l.k_row,  l.v_row,
        l.k_head,  l.v_head, l.v_offset(),
        a.scale,   a.first,  a.last};
  g.xq = a.n_tok == 1 && a.last ? xq : nullptr;
  g.window = a.window;
  KVS_CHECK(g.group >= 1 && g.group <= kMaxGroup, "cuda attention: ", g.group,
            " query heads per kv head (at most ", kMaxGroup, ")");
  return g;
}

// Rows the CPU wrote into pinned host memory, read over the bus by the SMs (a copy engine's
// copy would queue behind the ring's): fetched anew (.cv), never from a line cached before.
__global__ void fetch_rows(float4* dst, const float4* src, int n4) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += gridDim.x * blockDim.x)
    dst[i] = __ldcv(src + i);
}

}  // namespace

void fold_partials(Ctx& c, const AttentionArgs& a, const float* part, uint8_t* xq) {
  KVS_CHECK(a.n_tok == 1, "cuda: a fold of partials is of one token's");
  const Geo g = geo_of(a, xq);
  const size_t n = static_cast<size_t>(a.n_spans) * a.n_head * (a.kv.head_dim + 4);
  float* rows = c.scratch_part(n);
  const int n4 = static_cast<int>(n / 4), blocks = std::min(64, (n4 + 255) / 256);
  launch(fetch_rows, dim3(blocks), dim3(256), 0, c.stream, reinterpret_cast<float4*>(rows),
         reinterpret_cast<const float4*>(part), n4);
  attention_fold(c, g, rows);
}

void attention(Ctx& c, const AttentionArgs& a, uint8_t* xq, bool by_warp) {
  Geo g = geo_of(a, xq);
  const KvLayout& l = a.kv;
  if (a.n_tok == 1)
    attention_decode(c, g, l, by_warp);
  else
    attention_prefill(c, g, l);
}

}  // namespace kvs::cuda
