// The MTP drafter on the CUDA backend (skipped without a GPU): its block's engine and the
// target's share one device. Greedy output with MTP drafts is plain decoding's, token for token
// and logit for logit (steps of at most kCudaInvariantTokens tokens are batch-invariant),
// resident and streamed; the block's logits, token by token and for a whole prompt at once, agree
// with the CPU backend's within the CUDA-vs-CPU tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "draft_cases.h"
#include "kvs/backend/cuda/backend.h"
#include "kvs/backend/device.h"
#include "kvs/engine/mtp_draft.h"
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

constexpr double kTol = 2e-2;  // max |cuda - cpu| relative to max |cpu logit| (test_cuda.cpp's)

struct MtpCase {
  const char* preset;
  KvMode mode;
  int32_t n_seq, draft_max;
};

TEST(CudaMtp, GreedyIsPlainDecodingBitForBit) {
  if (!cuda_or_null()) GTEST_SKIP() << "no CUDA device";
  const MtpCase cases[] = {
      {"tiny-qwen35", KvMode::Resident, 2, 6},
      {"tiny-qwen35", KvMode::Stream, 1, 8},
      {"tiny-qwen35:q4_k", KvMode::Stream, 3, 4},
      {"tiny-qwen35:q4_k", KvMode::Auto, 4, 3},
  };
  uint32_t seed = 21;
  for (const MtpCase& mc : cases) {
    Case c;
    c.preset = mc.preset;
    c.seed = seed++;
    c.page = 16;
    c.batch = 64;
    c.n_ctx = 512;
    c.chunk = 16384;
    c.n_verify = mc.draft_max + 1;
    for (int32_t i = 0; i < mc.n_seq; ++i) {
      c.prompt_len.push_back(mc.mode == KvMode::Resident ? 40 + 9 * i : 220 + 31 * i);
      c.gen_len.push_back(64);
    }
    auto m = Model::load(std::string("synthetic:") + mc.preset);
    const size_t arena = mc.mode == KvMode::Resident ? 0 : case_arena(*m, c);
    SCOPED_TRACE(cat(mc.preset, ", up to ", mc.draft_max, " MTP drafts, mode ",
                     kv_mode_name(mc.mode), ", ", mc.n_seq, " sequences"));
    ASSERT_LE(mc.n_seq * (mc.draft_max + 1), kCudaInvariantTokens);
    auto plain_dev = cuda_or_null(), spec_dev = cuda_or_null();
    const Decoded want = decode(*m, nullptr, c, KvMode::Resident, 0, mc.draft_max, plain_dev.get());
    const Decoded got = decode(*m, nullptr, c, mc.mode, arena, mc.draft_max, spec_dev.get(), true);
    expect_same(want, got);
    EXPECT_GT(got.drafted, 0);
    if (mc.mode == KvMode::Stream) {
      EXPECT_GT(got.totals.bytes_in, 0u);
    }
    std::printf("%s %s: %lld of %lld MTP drafts accepted\n", mc.preset, kv_mode_name(mc.mode),
                static_cast<long long>(got.accepted), static_cast<long long>(got.drafted));
  }
}

// The block's logits of each entry of a prompt fed token by token, the target reading the
// block's embedding and head (then the prompt's last entry from one step of the whole prompt,
// the target with its own) on dev.
std::vector<std::vector<float>> mtp_logits(const Model& m, Device& dev,
                                           const std::vector<int32_t>& prompt) {
  EngineOptions o;
  o.n_ctx = 256;
  o.page_size = 16;
  o.kv_mode = KvMode::Resident;
  const int32_t V = m.config.n_vocab, T = static_cast<int32_t>(prompt.size());
  std::vector<std::vector<float>> rows;
  {
    MtpDrafter mtp(m, dev, o, 4, 0.0);
    Engine e(m, dev, o, &mtp.engine());
    mtp.follow(e);
    Sequence s = e.open_sequence();
    for (int32_t t = 0; t < T; ++t) {
      e.eval(s, &prompt[static_cast<size_t>(t)], 1);
      if (t == 0) continue;
      const float* l = mtp.engine().logits(0);
      rows.emplace_back(l, l + V);
    }
  }
  MtpDrafter mtp(m, dev, o, 4, 0.0);
  Engine e(m, dev, o);
  mtp.follow(e);
  Sequence s = e.open_sequence();
  e.eval(s, prompt.data(), T);
  const float* l = mtp.engine().logits(0);
  rows.emplace_back(l, l + V);
  return rows;
}

TEST(CudaMtp, LogitsAgreeWithTheCpu) {
  if (!cuda_or_null()) GTEST_SKIP() << "no CUDA device";
  for (const char* preset : {"tiny-qwen35", "tiny-qwen35:q4_k", "tiny-qwen35:q8_0"}) {
    auto m = Model::load(std::string("synthetic:") + preset);
    const std::vector<int32_t> prompt = tokens(9, 48, m->config.n_vocab);
    auto cpu = make_cpu_device(0);
    auto gpu = cuda_or_null();
    const auto want = mtp_logits(*m, *cpu, prompt);
    const auto got = mtp_logits(*m, *gpu, prompt);
    ASSERT_EQ(want.size(), got.size());
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      double scale = 1e-6, diff = 0;
      for (size_t j = 0; j < want[i].size(); ++j) {
        scale = std::max(scale, std::fabs(static_cast<double>(want[i][j])));
        diff = std::max(diff, std::fabs(static_cast<double>(want[i][j] - got[i][j])));
      }
      worst = std::max(worst, diff / scale);
      EXPECT_LT(diff / scale, kTol) << preset << ", row " << i;
    }
    std::printf("%s: worst relative MTP logit difference %.3g (tolerance %.3g)\n", preset, worst,
                kTol);
  }
}

}  // namespace
}  // namespace kvs::test
