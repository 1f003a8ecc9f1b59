// The server's scheduler (apps/kvstream/scheduler.cpp) on a synthetic model: a long prompt is
// read in chunks between the decode steps of a running request instead of stalling it; greedy
// tokens are the same whether requests run alone or together, and with speculation as without;
// a full scheduler refuses, and a cancelled request frees its sequence for the next.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "kvs/backend/device.h"
#include "kvs/engine/engine.h"
#include "kvs/model/model.h"
#include "scheduler.h"

namespace kvs::cli {
namespace {

// draft: a synthetic preset, the draft model of --spec draft.
struct Fixture {
  explicit Fixture(int32_t n_seq, int32_t n_batch, int32_t max_queue = 8, size_t cache_ram = 0,
                   KvMode mode = KvMode::Auto, SpecOptions spec = {}, const char* draft = nullptr,
                   const char* preset = "tiny")
      : model(Model::load(std::string("synthetic:") + preset)), dev(make_cpu_device(0)) {
    EngineOptions o;
    o.n_ctx = 1024;
    o.n_batch = n_batch;
    o.page_size = 16;
    o.n_seq = n_seq;
    o.cache_ram = cache_ram;
    o.kv_mode = mode;
    o.ring_chunk_bytes = 1024;  // with stream: the smallest arena, most pages streamed
    if (spec.mode != SpecMode::Off) o.n_verify = spec.draft_max + 1;
    if (draft) {
      draft_model = Model::load(std::string("synthetic:") + draft);
      drafter = std::make_unique<ModelDrafter>(*draft_model, *model, *dev, o, spec.draft_max, 0.0);
    }
    if (spec.mode == SpecMode::Mtp)
      mtp = std::make_unique<MtpDrafter>(*model, *dev, o, spec.draft_max, 0.0);
    eng = std::make_unique<Engine>(*model, *dev, o, mtp ? &mtp->engine() : nullptr);
    speculator = std::make_unique<Speculator>(spec, *eng, drafter.get(), mtp.get());
    sched = std::make_unique<Scheduler>(*eng, *model->tokenizer, max_queue, false,
                                        speculator->on() ? speculator.get() : nullptr);
  }
  std::unique_ptr<Model> model, draft_model;
  std::unique_ptr<Device> dev;
  std::unique_ptr<ModelDrafter> drafter;
  std::unique_ptr<MtpDrafter> mtp;
  std::unique_ptr<Engine> eng;
  std::unique_ptr<Speculator> speculator;
  std::unique_ptr<Scheduler> sched;
};

std::shared_ptr<Job> job_of(int32_t n_prompt, int64_t max_tokens, uint32_t seed) {
  GenRequest r;
  for (int32_t i = 0; i < n_prompt; ++i)
    r.prompt.push_back(
        static_cast<int32_t>((seed * 7919u + static_cast<uint32_t>(i) * 104729u) % 200u + 10u));
  r.sampling.temp = 0;
  r.max_tokens = max_tokens;
  r.top_logprobs = 0;  // the events then carry the token ids
  return std::make_shared<Job>(std::move(r));
}

// The job's events until its end (or, with `until_token`, its first token): token ids in `ids`.
bool drain(Job& j, std::vector<int32_t>& ids, bool until_token = false) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    std::vector<Event> ev;
    j.pop(ev, 0.05);
    for (const Event& e : ev) {
      if (e.logprob) ids.push_back(e.logprob->id);
      if (e.done) return e.error.empty();
    }
    if (until_token && !ids.empty()) return true;
  }
  return false;
}

TEST(Scheduler, LongPromptIsReadBetweenDecodeSteps) {
  Fixture f(2, 16);
  auto a = job_of(8, 400, 1);
  ASSERT_TRUE(f.sched->submit(a));
  std::vector<int32_t> before, during, b_ids;
  ASSERT_TRUE(drain(*a, before, true));
  std::vector<Event> ev;
  a->pop(ev, 0);  // what a made before b came
  ev.clear();
  auto b = job_of(300, 1, 2);
  ASSERT_TRUE(f.sched->submit(b));
  ASSERT_TRUE(drain(*b, b_ids));
  // Every step of b's prompt carried a token of a: 15 prompt tokens a step beside it.
  a->pop(ev, 0);
  for (const Event& e : ev) {
    ASSERT_FALSE(e.done) << "a ended before b was read; give it more tokens";
    if (e.logprob) during.push_back(e.logprob->id);
  }
  EXPECT_GE(during.size(), (300u + 14u) / 15u);
  a->cancelled = true;
}

TEST(Scheduler, TogetherGivesTheTokensOfAlone) {
  std::vector<std::vector<int32_t>> alone(3), together(3);
  {
    Fixture f(1, 32);
    for (uint32_t i = 0; i < 3; ++i) {
      auto j = job_of(20 + 40 * static_cast<int32_t>(i), 12, i);
      ASSERT_TRUE(f.sched->submit(j));
      ASSERT_TRUE(drain(*j, alone[i]));
    }
  }
  Fixture f(3, 32);
  std::vector<std::shared_ptr<Job>> jobs;
  for (uint32_t i = 0; i < 3; ++i) {
    jobs.push_back(job_of(20 + 40 * static_cast<int32_t>(i), 12, i));
    ASSERT_TRUE(f.sched->submit(jobs.back()));
  }
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(drain(*jobs[i], together[i]));
    EXPECT_EQ(together[i], alone[i]) << "request " << i;
    EXPECT_EQ(together[i].size(), 12u);
  }
  const SchedulerStats s = f.sched->stats();
  EXPECT_EQ(s.admitted, 3);
  EXPECT_EQ(s.finished, 3);
  EXPECT_EQ(s.completion_tokens, 36);
  EXPECT_EQ(s.prompt_tokens, 20 + 60 + 100);
}

TEST(Scheduler, FullRefusesAndCancelFreesTheSequence) {
  Fixture f(1, 16, 0);
  auto a = job_of(8, 900, 3);
  ASSERT_TRUE(f.sched->submit(a));
  std::vector<int32_t> ids;
  ASSERT_TRUE(drain(*a, ids, true));
  EXPECT_FALSE(f.sched->submit(job_of(8, 4, 4)));
  a->cancelled = true;
  for (int i = 0; i < 200 && f.sched->stats().slots_busy > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const SchedulerStats s = f.sched->stats();
  EXPECT_EQ(s.slots_busy, 0);
  EXPECT_EQ(s.cancelled, 1);
  EXPECT_EQ(s.rejected, 1);
  auto c = job_of(8, 4, 5);
  ASSERT_TRUE(f.sched->submit(c));
  ids.clear();
  ASSERT_TRUE(drain(*c, ids));
  EXPECT_EQ(ids.size(), 4u);
}

// The prompt cache under concurrent jobs, streamed through a ring: jobs sharing a prefix with
// earlier ones (finished or cancelled) reuse its pages and give the tokens of a server without
// a cache; the counts say how much was reused. Window layers keep the pages the windows reach;
// recurrent layers resume from the checkpoints the scheduler takes inside the first prompt
// (at its steps of -b: 32, 64, 96).
TEST(Scheduler, CachedPrefixesGiveTheTokensOfACacheFreeRun) {
  for (const char* preset : {"tiny", "tiny-gemma3", "tiny-qwen35"}) {
    SCOPED_TRACE(preset);
    const auto shared = [](int32_t tail, uint32_t seed) {
      auto j = job_of(100, 8, 1);  // the same 100 tokens, then a tail of its own
      GenRequest r = j->request;
      const auto t = job_of(tail, 8, seed)->request.prompt;
      r.prompt.insert(r.prompt.end(), t.begin(), t.end());
      return std::make_shared<Job>(std::move(r));
    };
    std::vector<std::vector<int32_t>> want(4), got(4);
    {
      Fixture f(1, 32, 8, 0, KvMode::Auto, {}, nullptr, preset);
      for (uint32_t i = 0; i < 4; ++i) {
        auto j = shared(5 + 9 * static_cast<int32_t>(i), 10 + i);
        ASSERT_TRUE(f.sched->submit(j));
        ASSERT_TRUE(drain(*j, want[i]));
      }
    }
    Fixture f(3, 32, 8, size_t{16} << 20, KvMode::Stream, {}, nullptr, preset);
    auto first = shared(3, 9);
    ASSERT_TRUE(f.sched->submit(first));
    std::vector<int32_t> ids;
    ASSERT_TRUE(drain(*first, ids, true));
    first->cancelled = true;  // its pages are kept all the same
    for (int i = 0; i < 200 && f.sched->stats().slots_busy > 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::vector<std::shared_ptr<Job>> jobs;
    for (uint32_t i = 0; i < 4; ++i) {
      jobs.push_back(shared(5 + 9 * static_cast<int32_t>(i), 10 + i));
      ASSERT_TRUE(f.sched->submit(jobs.back()));
    }
    for (size_t i = 0; i < 4; ++i) {
      ASSERT_TRUE(drain(*jobs[i], got[i]));
      EXPECT_EQ(got[i], want[i]) << "request " << i;
    }
    const SchedulerStats s = f.sched->stats();
    ASSERT_TRUE(s.prompt_cache.has_value());
    EXPECT_EQ(s.prompt_cache->hits, 4);
    // The first's 96 positions of the shared 100 tokens at least, then whatever the earlier
    // jobs left.
    EXPECT_GE(s.prompt_cache->tokens_reused, 4 * 96);
    EXPECT_GT(s.bytes_streamed, 0u);
    if (std::string(preset) == "tiny-qwen35") {
      EXPECT_GE(s.prompt_cache->checkpoints, 5);
    }
  }
}

// A prompt that repeats itself, so that prompt lookup has drafts to offer: `period` tokens of
// its own, `times` times over.
std::shared_ptr<Job> repeating(int32_t period, int32_t times, int64_t max_tokens, uint32_t seed) {
  GenRequest r = job_of(period, max_tokens, seed)->request;
  const std::vector<int32_t> once = r.prompt;
  for (int32_t i = 1; i < times; ++i) r.prompt.insert(r.prompt.end(), once.begin(), once.end());
  return std::make_shared<Job>(std::move(r));
}

// Speculation per slot: greedy jobs running together, each step of each verifying its drafts,
// give the tokens of plain decoding one job at a time; so they do with the prompt cache under
// a streaming ring, where later jobs reuse pages of earlier ones whose rejected drafts were
// rolled back. Rejected and accepted drafts both occur.
TEST(Scheduler, SpeculationGivesTheTokensOfPlainDecoding) {
  const auto jobs_of = [] {
    std::vector<std::shared_ptr<Job>> jobs;
    for (uint32_t i = 0; i < 4; ++i)
      jobs.push_back(repeating(5 + 3 * static_cast<int32_t>(i), 6, 40, i));
    return jobs;
  };
  std::vector<std::vector<int32_t>> want(4);
  {
    Fixture f(1, 32);
    auto jobs = jobs_of();
    for (size_t i = 0; i < 4; ++i) {
      ASSERT_TRUE(f.sched->submit(jobs[i]));
      ASSERT_TRUE(drain(*jobs[i], want[i]));
    }
  }
  for (const bool cached : {false, true}) {
    SCOPED_TRACE(cached ? "prompt cache, streamed" : "resident");
    Fixture f(3, 32, 8, cached ? size_t{16} << 20 : 0, cached ? KvMode::Stream : KvMode::Auto,
              SpecOptions{SpecMode::Ngram, 6, 1});
    for (int round = 0; round < (cached ? 2 : 1); ++round) {
      auto jobs = jobs_of();
      for (auto& j : jobs) ASSERT_TRUE(f.sched->submit(j));
      for (size_t i = 0; i < 4; ++i) {
        std::vector<int32_t> got;
        ASSERT_TRUE(drain(*jobs[i], got));
        EXPECT_EQ(got, want[i]) << "request " << i << ", round " << round;
      }
    }
    const SchedulerStats s = f.sched->stats();
    EXPECT_GT(s.accepted, 0);
    EXPECT_LT(s.accepted, s.drafted);
    // Fewer steps than tokens: accepted drafts came with the tokens before them.
    EXPECT_LT(s.steps, s.completion_tokens);
    if (cached) {
      ASSERT_TRUE(s.prompt_cache.has_value());
      EXPECT_GE(s.prompt_cache->hits, 4);
    }
  }
}

// With a temperature the drafts are accepted by speculative sampling. Top-k 1 makes each
// row's distribution one token, so the jobs must give the tokens of plain decoding, the
// frequency penalty applied to every verified row as to a sampled one; jobs with a real
// distribution run to their length.
TEST(Scheduler, SpeculationWithATemperature) {
  const auto job = [](uint32_t i, float temp, int32_t top_k) {
    GenRequest r = repeating(6, 8, 30, i)->request;
    r.sampling.temp = temp;
    r.sampling.top_k = top_k;
    r.sampling.seed = 100 + i;
    r.frequency_penalty = i % 2 ? 0.5f : 0.0f;
    return std::make_shared<Job>(std::move(r));
  };
  std::vector<std::vector<int32_t>> want(4);
  {
    Fixture f(1, 32);
    for (uint32_t i = 0; i < 4; ++i) {
      auto j = job(i, 0, 40);
      ASSERT_TRUE(f.sched->submit(j));
      ASSERT_TRUE(drain(*j, want[i]));
    }
  }
  Fixture f(2, 32, 8, 0, KvMode::Auto, SpecOptions{SpecMode::Ngram, 4, 1});
  std::vector<std::shared_ptr<Job>> jobs;
  for (uint32_t i = 0; i < 6; ++i) {
    jobs.push_back(i < 4 ? job(i, 0.7f, 1) : job(i, 0.8f, 40));
    ASSERT_TRUE(f.sched->submit(jobs.back()));
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    std::vector<int32_t> ids;
    ASSERT_TRUE(drain(*jobs[i], ids));
    if (i < 4)
      EXPECT_EQ(ids, want[i]) << "request " << i;
    else
      EXPECT_LE(ids.size(), 30u) << "request " << i;
  }
  const SchedulerStats s = f.sched->stats();
  EXPECT_EQ(s.finished, 6);
  EXPECT_GT(s.accepted, 0);
  EXPECT_LT(s.accepted, s.drafted);
}

// A draft model per slot: each slot's sequence in the draft engine follows the jobs it takes
// (a new job's prompt replacing the last one's tokens), greedy tokens those of plain decoding;
// the target drafting for itself has every draft accepted, another quantization of it most;
// with a temperature the jobs run to their end, their drafts verified with the drafts' q.
TEST(Scheduler, DraftModelPerSlotGivesTheTokensOfPlainDecoding) {
  const auto jobs_of = [](float temp) {
    std::vector<std::shared_ptr<Job>> jobs;
    for (uint32_t i = 0; i < 5; ++i) {
      GenRequest r = job_of(7 + 9 * static_cast<int32_t>(i), 30, i + 10)->request;
      r.sampling.temp = temp;
      r.sampling.seed = 50 + i;
      jobs.push_back(std::make_shared<Job>(std::move(r)));
    }
    return jobs;
  };
  std::vector<std::vector<int32_t>> want(5);
  {
    Fixture f(1, 32);
    auto jobs = jobs_of(0);
    for (size_t i = 0; i < jobs.size(); ++i) {
      ASSERT_TRUE(f.sched->submit(jobs[i]));
      ASSERT_TRUE(drain(*jobs[i], want[i]));
    }
  }
  for (const char* draft : {"tiny", "tiny:q4_0"}) {
    SCOPED_TRACE(draft);
    Fixture f(3, 32, 8, 0, KvMode::Stream, SpecOptions{SpecMode::Draft, 5, 1}, draft);
    auto jobs = jobs_of(0);
    for (auto& j : jobs) ASSERT_TRUE(f.sched->submit(j));
    for (size_t i = 0; i < jobs.size(); ++i) {
      std::vector<int32_t> got;
      ASSERT_TRUE(drain(*jobs[i], got));
      EXPECT_EQ(got, want[i]) << "request " << i;
    }
    const SchedulerStats s = f.sched->stats();
    EXPECT_GT(s.drafted, 30);
    if (std::string(draft) == "tiny") {
      EXPECT_EQ(s.accepted, s.drafted);
    } else {
      EXPECT_GT(s.accepted, s.drafted / 3);
    }
    EXPECT_LT(s.steps, s.completion_tokens);
  }
  Fixture f(2, 32, 8, 0, KvMode::Auto, SpecOptions{SpecMode::Draft, 4, 1}, "tiny:q4_0");
  auto jobs = jobs_of(0.9f);
  for (auto& j : jobs) ASSERT_TRUE(f.sched->submit(j));
  for (auto& j : jobs) {
    std::vector<int32_t> got;
    ASSERT_TRUE(drain(*j, got));
    EXPECT_LE(got.size(), 30u);
  }
  const SchedulerStats s = f.sched->stats();
  EXPECT_EQ(s.finished, 5);
  EXPECT_GT(s.accepted, 0);
  EXPECT_LT(s.accepted, s.drafted);
}

// The MTP block per slot (tiny-qwen35): each slot's engine sequence has its sequence in the
// block's engine, which follows the steps of the jobs it takes (more jobs than slots, so a slot's
// engine sequence is not always the slot's index); greedy tokens those of plain decoding.
TEST(Scheduler, MtpPerSlotGivesTheTokensOfPlainDecoding) {
  std::vector<std::vector<int32_t>> want(5);
  std::vector<std::shared_ptr<Job>> jobs;
  for (uint32_t i = 0; i < 5; ++i)
    jobs.push_back(job_of(7 + 9 * static_cast<int32_t>(i), 30, i + 10));
  {
    Fixture f(1, 32, 8, 0, KvMode::Auto, {}, nullptr, "tiny-qwen35");
    for (size_t i = 0; i < jobs.size(); ++i) {
      ASSERT_TRUE(f.sched->submit(jobs[i]));
      ASSERT_TRUE(drain(*jobs[i], want[i]));
    }
  }
  jobs.clear();
  for (uint32_t i = 0; i < 5; ++i)
    jobs.push_back(job_of(7 + 9 * static_cast<int32_t>(i), 30, i + 10));
  Fixture f(3, 32, 8, 0, KvMode::Stream, SpecOptions{SpecMode::Mtp, 5, 1}, nullptr, "tiny-qwen35");
  for (auto& j : jobs) ASSERT_TRUE(f.sched->submit(j));
  for (size_t i = 0; i < jobs.size(); ++i) {
    std::vector<int32_t> got;
    ASSERT_TRUE(drain(*jobs[i], got));
    EXPECT_EQ(got, want[i]) << "request " << i;
  }
  EXPECT_GT(f.sched->stats().drafted, 30);
}

// The MTP block with the prompt cache: the same jobs twice, the second time resuming from the
// first's checkpoints (in whichever slot each lands), give the tokens of plain decoding.
TEST(Scheduler, MtpWithThePromptCacheGivesTheTokensOfPlainDecoding) {
  const auto jobs_of = [] {
    std::vector<std::shared_ptr<Job>> jobs;
    for (uint32_t i = 0; i < 5; ++i)
      jobs.push_back(job_of(7 + 9 * static_cast<int32_t>(i), 30, i + 10));
    return jobs;
  };
  std::vector<std::vector<int32_t>> want(5);
  {
    Fixture f(1, 32, 8, 0, KvMode::Auto, {}, nullptr, "tiny-qwen35");
    auto jobs = jobs_of();
    for (size_t i = 0; i < jobs.size(); ++i) {
      ASSERT_TRUE(f.sched->submit(jobs[i]));
      ASSERT_TRUE(drain(*jobs[i], want[i]));
    }
  }
  Fixture f(3, 32, 8, size_t{16} << 20, KvMode::Stream, SpecOptions{SpecMode::Mtp, 5, 1}, nullptr,
            "tiny-qwen35");
  for (int round = 0; round < 2; ++round) {
    auto jobs = jobs_of();
    for (auto& j : jobs) ASSERT_TRUE(f.sched->submit(j));
    for (size_t i = 0; i < jobs.size(); ++i) {
      std::vector<int32_t> got;
      ASSERT_TRUE(drain(*jobs[i], got));
      EXPECT_EQ(got, want[i]) << "request " << i << ", round " << round;
    }
  }
  const SchedulerStats s = f.sched->stats();
  ASSERT_TRUE(s.prompt_cache.has_value());
  EXPECT_GE(s.prompt_cache->hits, 5);
  EXPECT_GT(s.drafted, 30);
}

}  // namespace
}  // namespace kvs::cli
