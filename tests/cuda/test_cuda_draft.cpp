// A draft model on the CUDA backend (skipped without a GPU): its engine and the target's share
// one device (its scratch, its recorded steps). Greedy output with a draft model is plain
// decoding's, token for token and logit for logit (steps of at most kCudaInvariantTokens tokens
// are batch-invariant); the target drafting for itself has nearly every draft accepted,
// resident, streamed and with qwen35's recurrent state; under a device limit the draft model's
// memory comes out of the target's arena.
#include <gtest/gtest.h>

#include <string>

#include "draft_cases.h"
#include "kvs/backend/cuda/backend.h"
#include "kvs/backend/device.h"
#include "kvs/util/error.h"

namespace kvs::test {
namespace {

std::unique_ptr<Device> cuda_or_null() {
  try {
    return make_cuda_device(0, CudaOptions{});
  } catch (const Error&) {
    return nullptr;
  }
}

struct DraftCase {
  const char* target;
  const char* draft;
  KvMode mode;
  int32_t n_seq, draft_max;
};

TEST(CudaDraft, GreedyIsPlainDecodingBitForBit) {
  if (!cuda_or_null()) GTEST_SKIP() << "no CUDA device";
  const DraftCase cases[] = {
      {"tiny-qwen3:q4_0", "tiny-qwen3:q4_0", KvMode::Resident, 2, 6},
      {"tiny-qwen3:q4_0", "tiny-qwen3:q4_0", KvMode::Stream, 2, 5},
      {"tiny:q8_0", "tiny:q4_0", KvMode::Stream, 3, 4},
      {"tiny-h128:q4_0", "tiny-h128:q4_0", KvMode::Auto, 1, 8},
      {"tiny-qwen35", "tiny-qwen35", KvMode::Resident, 2, 6},
      {"tiny-qwen35:q4_k", "tiny-qwen35:q4_k", KvMode::Stream, 1, 4},
  };
  uint32_t seed = 11;
  for (const DraftCase& dc : cases) {
    Case c;
    c.preset = dc.target;
    c.seed = seed++;
    c.page = 16;
    c.batch = 64;
    c.n_ctx = 512;
    c.chunk = 16384;
    c.n_verify = dc.draft_max + 1;
    for (int32_t i = 0; i < dc.n_seq; ++i) {
      c.prompt_len.push_back(dc.mode == KvMode::Resident ? 40 + 9 * i : 220 + 31 * i);
      c.gen_len.push_back(64);
    }
    auto m = Model::load(std::string("synthetic:") + dc.target);
    auto d = Model::load(std::string("synthetic:") + dc.draft);
    const size_t arena = dc.mode == KvMode::Resident ? 0 : case_arena(*m, c);
    SCOPED_TRACE(cat(dc.target, " drafted by ", dc.draft, ", mode ", kv_mode_name(dc.mode)));
    auto plain_dev = cuda_or_null(), spec_dev = cuda_or_null();
    const Decoded want = decode(*m, nullptr, c, KvMode::Resident, 0, dc.draft_max, plain_dev.get());
    const Decoded got = decode(*m, d.get(), c, dc.mode, arena, dc.draft_max, spec_dev.get());
    ASSERT_LE(dc.n_seq * (dc.draft_max + 1), kCudaInvariantTokens);
    expect_same(want, got);
    EXPECT_GT(got.drafted, 0);
    if (std::string(dc.target) == dc.draft) {
      EXPECT_GE(got.accepted, got.drafted * 9 / 10);
    }
    if (dc.mode == KvMode::Stream) {
      EXPECT_GT(got.totals.bytes_in, 0u);
    }
  }
}

// Under a device limit the draft model's engine, built first, leaves the target's arena less
// by what it holds, but for the kernels' scratch the two engines share.
TEST(CudaDraft, ItsMemoryComesOutOfTheTargetsArena) {
  if (!cuda_or_null()) GTEST_SKIP() << "no CUDA device";
  auto m = Model::load("synthetic:tiny-h128:q4_0");
  auto d = Model::load("synthetic:tiny:q4_0");
  EngineOptions o;
  o.n_ctx = 16384;  // the target's KV well above the draft model's weights and KV
  o.n_seq = 2;
  o.page_size = 16;
  o.n_verify = 5;
  o.phase_arena = false;
  size_t want = 0, rest = 0, draft_bytes = 0;  // rest: the device's own and the target's buffers
  {
    auto dev = cuda_or_null();
    {
      Engine e(*m, *dev, o);
      want = e.arena_bytes();
      rest = dev->used() - want;
    }
    // The kernels' scratch, which the first engine on a device allocates for both, is there
    // now: what the draft model adds is its own.
    const size_t before = dev->used();
    ModelDrafter dr(*d, *m, *dev, o, 4, 0.0);
    draft_bytes = dr.device_bytes();
    ASSERT_EQ(dev->used() - before, draft_bytes);
  }
  ASSERT_LT(draft_bytes, want);
  const size_t cap = rest + draft_bytes + (want - draft_bytes) / 2;
  size_t alone = 0, beside = 0;
  {
    auto dev = make_cuda_device(cap, CudaOptions{});
    alone = Engine(*m, *dev, o).arena_bytes();
  }
  {
    auto dev = make_cuda_device(cap, CudaOptions{});
    ModelDrafter dr(*d, *m, *dev, o, 4, 0.0);
    beside = Engine(*m, *dev, o).arena_bytes();
  }
  const size_t page =
      KvLayout::make(o.k_type, o.v_type, o.page_size, m->config.n_head_kv, m->config.head_dim)
          .page_bytes();
  EXPECT_LT(alone, want);
  EXPECT_LE(alone - beside, draft_bytes + page);
  EXPECT_GE(alone - beside, draft_bytes / 2);
}

}  // namespace
}  // namespace kvs::test
