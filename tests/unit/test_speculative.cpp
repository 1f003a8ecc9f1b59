// Speculative decoding's verify step: a sequence's token and up to n_verify - 1 drafts in one
// step, every row of logits bit-identical to the one-token steps', the rejected drafts rolled
// back (Engine::truncate) across page boundaries, ring chunks, window layers and recurrent
// layers (their states recomputed from the step's inputs).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "kvs/util/error.h"
#include "speculative_cases.h"

namespace kvs::test {
namespace {

TEST(Speculative, VerifiedRowsAreBitIdenticalToOneTokenSteps) {
  auto dev = make_cpu_device(0);
  const VerifyTotals t = verify_cases(*dev, 24);
  // The cases must have exercised what they are for.
  EXPECT_GT(t.accepted, 200);
  EXPECT_GT(t.rejected, 100);
  EXPECT_GT(t.page_rollbacks, 10);
  EXPECT_GE(t.streamed, 4);
}

TEST(Speculative, TruncateRefusesWhatItCannotUndo) {
  auto m = Model::load("synthetic:tiny-gemma3");
  auto dev = make_cpu_device(0);
  EngineOptions o;
  o.n_ctx = 256;
  o.page_size = 8;
  o.n_verify = 4;
  Engine e(*m, *dev, o);
  Sequence s = e.open_sequence();
  const auto p = tokens(1, 100, m->config.n_vocab);
  e.eval(s, p.data(), 100);
  EXPECT_THROW(e.truncate(s, 101), Error);
  EXPECT_THROW(e.truncate(s, 96), Error);  // 4 back: the windows keep only n_verify - 1
  e.truncate(s, 97);
  EXPECT_EQ(s.n_past, 97);
  const std::vector<int32_t> five = {1, 2, 3, 4, 5};
  EXPECT_THROW(e.step({BatchEntry{&s, five.data(), 5, true}}), Error);  // more than n_verify
  e.step({BatchEntry{&s, five.data(), 4, true}});
  EXPECT_EQ(s.n_past, 101);
  // Recurrent layers roll back only within the last step, a verify step.
  auto q = Model::load("synthetic:tiny-qwen35");
  Engine r(*q, *dev, o);
  Sequence t = r.open_sequence();
  r.eval(t, p.data(), 10);
  EXPECT_THROW(r.truncate(t, 9), Error);
  r.step({BatchEntry{&t, five.data(), 4, true}});
  EXPECT_THROW(r.truncate(t, 10), Error);  // all four: the step's first token stays
  r.truncate(t, 11);
  EXPECT_THROW(r.truncate(t, 10), Error);  // once
}

// A draft model's steps: a verify step, then one-token steps that extend it. A rollback into
// them recomputes the recurrent states of the tokens kept, bit for bit those of a sequence fed
// only these (token by token); an extension needs a verify step before it and room in n_verify.
TEST(Speculative, ExtendedVerifyStepsRollBack) {
  auto q = Model::load("synthetic:tiny-qwen35");
  auto dev = make_cpu_device(0);
  EngineOptions o;
  o.n_ctx = 256;
  o.page_size = 8;
  o.n_seq = 2;
  o.n_verify = 5;
  Engine e(*q, *dev, o);
  const int32_t V = q->config.n_vocab;
  const auto p = tokens(3, 30, V);
  const std::vector<int32_t> t = {11, 12, 13, 14, 15, 16};
  Sequence a = e.open_sequence(), b = e.open_sequence();
  e.eval(a, p.data(), 30);
  e.eval(b, p.data(), 30);
  EXPECT_THROW(e.step({BatchEntry{&a, &t[0], 1, true, true}}), Error);  // no verify step before
  e.step({BatchEntry{&a, &t[0], 2, true}});
  e.step({BatchEntry{&a, &t[2], 1, true, true}});
  e.step({BatchEntry{&a, &t[3], 1, true, true}});
  EXPECT_THROW(e.step({BatchEntry{&a, &t[4], 2, true, true}}), Error);  // 4 + 2 > n_verify
  EXPECT_THROW(e.truncate(a, 30), Error);  // the verify step's first token stays
  e.truncate(a, 33);                       // t[2] kept, t[3] dropped
  e.step({BatchEntry{&a, &t[5], 1}});
  const std::vector<float> got(e.logits(0), e.logits(0) + V);
  e.step({BatchEntry{&b, &t[0], 3, true}});
  e.step({BatchEntry{&b, &t[5], 1}});
  ASSERT_EQ(std::memcmp(got.data(), e.logits(0), got.size() * sizeof(float)), 0);
  EXPECT_THROW(e.step({BatchEntry{&a, &t[0], 1, true, true}}), Error);  // the last was no verify
}

}  // namespace
}  // namespace kvs::test
