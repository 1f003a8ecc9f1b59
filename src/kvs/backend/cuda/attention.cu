// Attention over spans, continuing a running state (max, sum, unnormalised output) across
// calls exactly as the CPU kernel does, so a run that sees its spans in several calls (the
// ring's chunks) computes the same operations as one that sees them at once. One token's query
// (decode) goes to attention_decode.cu and attention_decode_tc.cu, several tokens' (prefill)
// to attention_prefill.cu; the code they share is in attention_tile.cuh.
#include "kvs/backend/cuda/attention_tile.cuh"

namespace kvs::cuda {

void attention(Ctx& c, const AttentionArgs& a, uint8_t* xq, bool by_warp) {
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
  if (a.n_tok == 1)
    attention_decode(c, g, l, by_warp);
  else
    attention_prefill(c, g, l);
}

}  // namespace kvs::cuda
