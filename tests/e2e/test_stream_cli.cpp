// Streaming end to end through `kvstream run` on the real model: SmolLM2-135M with an arena
// that holds about 10 % of its KV at 2,000 tokens gives the same greedy text as a resident run,
// and --verbose shows the pages streaming; --parallel sequences decode as they would alone.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common.h"

namespace kvs {
namespace {

struct Outcome {
  int status = -1;
  std::string out, err;
  nlohmann::json json;
};

std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Outcome kvstream(const std::string& args, const std::string& name) {
  const auto dir = test::temp_dir("stream_cli");
  const auto out = dir / (name + ".out"), err = dir / (name + ".err"), js = dir / (name + ".json");
  const std::string cmd = test::binary() + " " + args + " --json " + js.string() + " >" +
                          out.string() + " 2>" + err.string();
  const int rc = std::system(cmd.c_str());
  Outcome o;
  o.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  o.out = slurp(out);
  o.err = slurp(err);
  if (o.status == 0) o.json = nlohmann::json::parse(slurp(js));
  return o;
}

std::string long_prompt_file() {
  const auto path = test::temp_dir("stream_cli") / "long.txt";
  std::ofstream f(path);
  const char* para =
      "The lighthouse stood on a rock at the edge of the bay, and every night its keeper climbed "
      "the one hundred and twelve steps to light the lamp. Ships passed in the dark, and the "
      "keeper wrote their names in a book. ";
  for (int i = 0; i < 40; ++i) f << i << ". " << para;
  return path.string();
}

// A prompt that repeats itself, as code edits and summaries quote their input.
std::string source_dir_file() {
  return test::source_dir() + "/bench/prompts/code-edit.txt";
}

class StreamCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(test::smollm2())) GTEST_SKIP() << "no " << test::smollm2();
  }
};

TEST_F(StreamCli, SmolLM2At2000TokensWithTenPercentArenaMatchesResident) {
  const std::string common = "run -m " + test::smollm2() + " -f " + long_prompt_file() +
                             " -n 24 -c 2100 --page-size 32 --temp 0";
  const Outcome res = kvstream(common + " --kv-mode resident", "resident");
  ASSERT_EQ(res.status, 0) << res.err;
  const size_t n_prompt = res.json["prompt_tokens"].size();
  ASSERT_GE(n_prompt, 1950u);
  // SmolLM2's KV: 30 layers x 2 x 192 f16 values = 22.5 KiB per token; 10 % of 2,000 tokens,
  // while decoding too (the phase arena would lend it the prefill's 12 MiB workspace).
  const size_t kv_2000 = 30u * 2 * 192 * 2 * 2000;
  const std::string arena = std::to_string(kv_2000 / 10);
  const Outcome str =
      kvstream(common + " --kv-arena " + arena + " --no-phase-arena --verbose", "stream10");
  ASSERT_EQ(str.status, 0) << str.err;
  EXPECT_EQ(str.json["tokens"], res.json["tokens"]) << "greedy text differs from resident";
  EXPECT_EQ(str.out, res.out);
  const auto& dec = str.json["kv"]["decode"];
  // About 90 % of the history streams every decode step.
  EXPECT_GT(dec["bytes_streamed_per_token"].get<double>(), 0.8 * 30 * 2 * 192 * 2 * n_prompt)
      << dec.dump();
  EXPECT_GT(dec["chunks"].get<int64_t>(), 0);
  EXPECT_NE(str.err.find("kvstream: decode 1: 1 tok"), std::string::npos) << str.err;
  EXPECT_NE(str.err.find("repartition: resident"), std::string::npos) << str.err;
  EXPECT_EQ(res.json["kv"]["decode"]["bytes_streamed"].get<size_t>(), 0u);
}

TEST_F(StreamCli, ParallelSequencesDecodeAsTheyWouldAlone) {
  const auto dir = test::temp_dir("stream_cli");
  const std::string
      a = "Write a haiku about the sea.",
      b = "List three facts about the planet Mars, one per line, and then explain which of them "
          "matters most for a future crewed mission.";
  std::ofstream(dir / "two.txt") << a << "\n" << b << "\n";
  std::ofstream(dir / "a.txt") << a;
  std::ofstream(dir / "b.txt") << b;
  const std::string common = "run -m " + test::smollm2() +
                             " --chat -n 40 --temp 0 -c 256 "
                             "--page-size 8 -b 64 --kv-arena 1M --no-phase-arena";
  const Outcome both = kvstream(common + " --parallel 2 -f " + (dir / "two.txt").string(), "two");
  ASSERT_EQ(both.status, 0) << both.err;
  const Outcome one = kvstream(common + " -f " + (dir / "a.txt").string(), "a");
  const Outcome two = kvstream(common + " -f " + (dir / "b.txt").string(), "b");
  ASSERT_EQ(one.status, 0) << one.err;
  ASSERT_EQ(two.status, 0) << two.err;
  EXPECT_EQ(both.json["sequences"][0]["tokens"], one.json["tokens"]);
  EXPECT_EQ(both.json["sequences"][1]["tokens"], two.json["tokens"]);
  EXPECT_GT(both.json["kv"]["decode"]["bytes_streamed"].get<size_t>(), 0u)
      << "the arena should be too small for both histories";
}

// Prompt lookup on real text that repeats itself: the drafts are verified in the steps of the
// tokens before them, greedy output equal to decoding without them, while the history streams
// through a small arena and rejected drafts roll back.
TEST_F(StreamCli, NgramSpeculationGivesTheTokensOfPlainDecoding) {
  const std::string prompt =
      "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. "
      "The quick brown fox";
  const std::string common = "run -m " + test::smollm2() + " -p \"" + prompt +
                             "\" -n 64 --temp 0 -c 512 --page-size 8 -b 64 --kv-arena 1M "
                             "--no-phase-arena";
  const Outcome off = kvstream(common, "spec_off");
  const Outcome on = kvstream(common + " --spec ngram --draft-max 6", "spec_on");
  ASSERT_EQ(off.status, 0) << off.err;
  ASSERT_EQ(on.status, 0) << on.err;
  EXPECT_EQ(on.json["tokens"], off.json["tokens"]);
  const auto& sp = on.json["speculation"];
  EXPECT_GT(sp["accepted"].get<int64_t>(), 10) << on.err;
  EXPECT_LT(sp["sequence_steps"].get<int64_t>(), 50) << "drafts should save steps";
  EXPECT_GT(on.json["kv"]["decode"]["bytes_streamed"].get<size_t>(), 0u);
  EXPECT_NE(on.err.find("kvstream: speculation (ngram):"), std::string::npos) << on.err;
  const Outcome bad = kvstream("run -m " + test::smollm2() + " -p hi --spec eagle", "spec_bad");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("--spec must be off, ngram, draft or mtp, got 'eagle'"), std::string::npos)
      << bad.err;
  const Outcome mtp = kvstream("run -m " + test::smollm2() + " -p hi --spec mtp", "spec_mtp");
  EXPECT_NE(mtp.status, 0);
  EXPECT_NE(mtp.err.find("is a llama model; MTP drafts come from the nextn layer"),
            std::string::npos)
      << mtp.err;
}

// A draft model: SmolLM2 drafting for itself (its one-token steps give the logits the target's
// verify steps give, so nearly every draft is accepted), greedy output equal to decoding
// without it while the target's history streams through a small arena; -md alone turns it on.
// A draft model of another vocabulary, or none, is refused by name.
TEST_F(StreamCli, DraftModelSpeculationGivesTheTokensOfPlainDecoding) {
  const std::string common = "run -m " + test::smollm2() +
                             " -p \"Write a short story about a fox.\" --chat -n 64 --temp 0 "
                             "-c 512 --page-size 8 -b 64 --kv-arena 1M --no-phase-arena";
  const Outcome off = kvstream(common + " --spec off", "draft_off");
  const Outcome on =
      kvstream(common + " -md " + test::smollm2() + " --draft-max 6 --draft-p-min 0.2", "draft_on");
  ASSERT_EQ(off.status, 0) << off.err;
  ASSERT_EQ(on.status, 0) << on.err;
  EXPECT_EQ(on.json["tokens"], off.json["tokens"]);
  const auto& sp = on.json["speculation"];
  EXPECT_EQ(sp["mode"], "draft");
  EXPECT_GT(sp["drafted"].get<int64_t>(), 20) << on.err;
  EXPECT_GE(sp["acceptance_rate"].get<double>(), 0.95) << on.err;
  EXPECT_GT(sp["tokens_per_sequence_step"].get<double>(), 1.3) << on.err;
  EXPECT_GT(sp["draft_device_bytes"].get<size_t>(), 0u);
  EXPECT_GT(on.json["kv"]["decode"]["bytes_streamed"].get<size_t>(), 0u);
  EXPECT_NE(on.err.find("kvstream: draft model"), std::string::npos) << on.err;
  EXPECT_NE(on.err.find("kvstream: speculation (draft):"), std::string::npos) << on.err;
  // kvstream plan counts what the draft model takes, as the run measured it on the CPU (a limit
  // that leaves the KV less than all it needs).
  const Outcome plan = kvstream("plan -m " + test::smollm2() + " -c 512 --page-size 8 -b 64 -md " +
                                    test::smollm2() + " --draft-max 6 --vram-limit 205M",
                                "draft_plan");
  ASSERT_EQ(plan.status, 0) << plan.err;
  EXPECT_EQ(plan.json["draft_bytes"], sp["draft_device_bytes"]);
  EXPECT_NE(plan.out.find("less weights and buffers and the draft model"), std::string::npos)
      << plan.out;
  const std::string m = "run -m " + test::smollm2() + " -p hi -n 4";
  Outcome bad = kvstream(m + " -md synthetic:tiny", "draft_vocab");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("-md/--model-draft: the draft model's vocabulary is not the target's: "
                         "512 tokens against 49152 (vocab size)"),
            std::string::npos)
      << bad.err;
  bad = kvstream(m + " --spec draft", "draft_none");
  EXPECT_NE(bad.err.find("--spec draft needs a draft model"), std::string::npos) << bad.err;
  bad = kvstream(m + " --spec ngram -md " + test::smollm2(), "draft_ngram");
  EXPECT_NE(bad.err.find("-md/--model-draft is for --spec draft"), std::string::npos) << bad.err;
}

// bench --spec: at each depth the prompt's greedy continuation with and without drafts, the
// same tokens, the drafts' acceptance and the steps they saved, while the history streams
// through a small arena past the depth's fill.
TEST_F(StreamCli, BenchSpecComparesWithPlainDecoding) {
  const std::string bench = "bench -m " + test::smollm2() + " -f " + source_dir_file() +
                            " --chat --n-gen 48 --page-size 8 -b 64 --kv-arena 1M --no-phase-arena "
                            "--fill random --depths 0,400";
  const Outcome o = kvstream(bench + " --spec ngram --draft-max 6 -r 2", "bench_spec");
  ASSERT_EQ(o.status, 0) << o.err;
  ASSERT_EQ(o.json["runs"].size(), 2u);
  for (const auto& r : o.json["runs"]) {
    const auto& sp = r["spec"];
    EXPECT_TRUE(sp["same_tokens"].get<bool>()) << r.dump();
    EXPECT_EQ(sp["mode"], "ngram");
    EXPECT_GT(sp["drafted"].get<int64_t>(), 0) << r.dump();
    EXPECT_GT(sp["plain_tg_tokens_per_s"].get<double>(), 0) << r.dump();
    EXPECT_EQ(sp["tg_tokens_per_s_reps"].size(), 2u);
  }
  // Behind random keys the model no longer quotes the prompt; at depth 0 it does.
  const auto& sp0 = o.json["runs"][0]["spec"];
  EXPECT_GT(sp0["accepted"].get<int64_t>(), 20) << sp0.dump();
  EXPECT_GT(sp0["tokens_per_step"].get<double>(), 1.5) << sp0.dump();
  EXPECT_GT(o.json["runs"][1]["spec"]["streamed_bytes_per_token"].get<double>(), 0)
      << "the arena should be too small for a depth of 400";
  EXPECT_NE(o.out.find("tg48 spec ngram"), std::string::npos) << o.out;
  Outcome bad = kvstream("bench -m " + test::smollm2() + " --spec ngram", "bench_spec_nofile");
  EXPECT_NE(bad.err.find("bench --spec: give the prompt the drafts continue with -f/--file"),
            std::string::npos)
      << bad.err;
  bad = kvstream("bench -m " + test::smollm2() + " -f " + source_dir_file() + " --spec mtp",
                 "bench_spec_mtp");
  EXPECT_NE(bad.err.find("MTP drafts come from the nextn layer"), std::string::npos) << bad.err;
}

// bench --spec oracle: drafts of a chosen acceptance, from the plain run's tokens, over a history
// that streams (prefilled with the same random tokens for both runs); the output is plain
// decoding's at every P, every draft is kept at P 1, and fewer at P 0.5.
TEST_F(StreamCli, BenchOracleDraftsHaveTheAcceptanceAskedFor) {
  const std::string bench = "bench -m " + test::smollm2() + " -f " + source_dir_file() +
                            " --n-gen 40 --page-size 8 -b 64 --kv-arena 1M --no-phase-arena "
                            "--depths 0,300 --spec oracle --draft-max 3 --draft-min 3";
  double acceptance[2] = {0, 0};
  for (const char* p : {"1", "0.5"}) {
    const Outcome o = kvstream(bench + " --accept " + p, std::string("bench_oracle_") + p);
    ASSERT_EQ(o.status, 0) << o.err;
    ASSERT_EQ(o.json["runs"].size(), 2u);
    for (const auto& r : o.json["runs"]) {
      const auto& sp = r["spec"];
      EXPECT_TRUE(sp["same_tokens"].get<bool>()) << r.dump();
      EXPECT_EQ(sp["mode"], "oracle");
      EXPECT_EQ(sp["accept_p"].get<double>(), std::stod(p));
      acceptance[p[0] == '1' ? 0 : 1] += sp["acceptance"].get<double>() / 2;
    }
    EXPECT_GT(o.json["runs"][1]["spec"]["streamed_bytes_per_token"].get<double>(), 0);
    EXPECT_NE(o.out.find(std::string("oracle (drafts kept with P ") + p + ")"), std::string::npos)
        << o.out;
  }
  EXPECT_EQ(acceptance[0], 1.0);
  EXPECT_LT(acceptance[1], 0.6);
  EXPECT_GT(acceptance[1], 0.1);
  Outcome bad = kvstream(bench, "bench_oracle_no_p");
  EXPECT_NE(bad.err.find("--spec oracle needs --accept P"), std::string::npos) << bad.err;
  bad = kvstream("run -m " + test::smollm2() + " -p hi -n 1 --spec oracle", "run_oracle");
  EXPECT_NE(bad.err.find("--spec must be off, ngram, draft or mtp, got 'oracle'"),
            std::string::npos)
      << bad.err;
}

// bench --ingest: whole prompts read from an empty cache, timed, the longer one streaming
// through a small arena; no depth table unless --depths is given.
TEST_F(StreamCli, BenchIngestTimesWholePrompts) {
  const Outcome o = kvstream("bench -m " + test::smollm2() +
                                 " --page-size 8 -b 64 --kv-arena 1M --no-phase-arena --ingest "
                                 "600,100",
                             "bench_ingest");
  ASSERT_EQ(o.status, 0) << o.err;
  ASSERT_EQ(o.json["runs"].size(), 2u) << o.json.dump();
  int64_t want[] = {100, 600};
  for (int i = 0; i < 2; ++i) {
    const auto& in = o.json["runs"][static_cast<size_t>(i)]["ingest"];
    EXPECT_EQ(in["tokens"].get<int64_t>(), want[i]);
    EXPECT_EQ(in["batch"].get<int64_t>(), 64);
    EXPECT_GT(in["seconds"].get<double>(), 0);
    EXPECT_NEAR(in["tokens_per_s"].get<double>() * in["seconds"].get<double>(), want[i], 1e-6);
  }
  EXPECT_GT(o.json["runs"][1]["ingest"]["streamed_bytes"].get<int64_t>(), 0)
      << "600 tokens should outgrow a 1M arena";
  EXPECT_NE(o.out.find("ingest 600 (-b 64)"), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("| tg"), std::string::npos) << o.out;
  const Outcome bad = kvstream("bench -m " + test::smollm2() + " --ingest 0", "bench_ingest_0");
  EXPECT_NE(bad.err.find("--ingest: 0 is not a prompt length"), std::string::npos) << bad.err;
}

TEST_F(StreamCli, BadStreamingInputIsRefusedClearly) {
  const std::string m = "run -m " + test::smollm2() + " -p hi -n 1";
  Outcome o = kvstream(m + " --kv-arena 1K", "small");
  EXPECT_EQ(o.status, 1);
  EXPECT_NE(o.err.find("below the minimum"), std::string::npos) << o.err;
  o = kvstream(m + " --kv-mode resident --kv-arena 1M", "resident_small");
  EXPECT_EQ(o.status, 1);
  EXPECT_NE(o.err.find("--kv-mode auto or stream"), std::string::npos) << o.err;
  o = kvstream(m + " --kv-mode sideways", "mode");
  EXPECT_EQ(o.status, 1);
  EXPECT_NE(o.err.find("sideways"), std::string::npos) << o.err;
  o = kvstream(m + " --kv-arena 12Q", "size");
  EXPECT_EQ(o.status, 1);
  EXPECT_NE(o.err.find("--kv-arena"), std::string::npos) << o.err;
  o = kvstream(m + " --vram-limit 10M", "vram");
  EXPECT_EQ(o.status, 1);
  EXPECT_NE(o.err.find("weights"), std::string::npos) << o.err;
  o = kvstream("plan -m " + test::smollm2() + " -c 2000 --kv-arena 1K", "plan_small");
  EXPECT_EQ(o.status, 1);
  EXPECT_NE(o.err.find("minimum"), std::string::npos) << o.err;
}

TEST_F(StreamCli, PlanPrintsThePartitionAndTheBound) {
  const Outcome o = kvstream(
      "plan -m synthetic:llama3-8b:q4_0 -c 128k -ctk q8_0 -ctv q4_0 --kv-arena 2G "
      "--h2d-gbps 50",
      "plan");
  ASSERT_EQ(o.status, 0) << o.err;
  EXPECT_NE(o.out.find("partition"), std::string::npos) << o.out;
  // 128K tokens x 52 KiB per token = 6.5 GiB of KV; 2 GiB arena. S/B at 50 GB/s bounds the step.
  const auto& j = o.json;
  EXPECT_EQ(j["kv_bytes"].get<size_t>(), size_t{131072} * 53248);
  EXPECT_GT(j["n_slots"].get<int>(), 0);
  const double s = j["streamed_bytes_per_step"].get<double>();
  EXPECT_DOUBLE_EQ(j["copy_s"].get<double>(), s / 50e9);
  EXPECT_DOUBLE_EQ(j["predicted_step_s"].get<double>(),
                   std::max(j["copy_s"].get<double>(), j["t_gpu_s"].get<double>()));
  EXPECT_GT(s, 6.5 * (1 << 30) - j["arena_bytes"].get<double>());
  // The phase arena: --kv-arena is the prefill's, in whole pages as the engine takes it; the
  // decode's has the workspace too.
  EXPECT_TRUE(j["phase_arena"].get<bool>());
  const size_t page = j["page_bytes"].get<size_t>();
  EXPECT_EQ(j["prefill_arena_bytes"].get<size_t>(), (size_t{2} << 30) / page * page);
  EXPECT_GT(j["workspace_bytes"].get<size_t>(), size_t{512} * 4096 * 4);
  EXPECT_EQ(j["arena_bytes"].get<size_t>(),
            j["prefill_arena_bytes"].get<size_t>() + j["workspace_bytes"].get<size_t>());
  EXPECT_NE(o.out.find("phase      a prefill takes"), std::string::npos) << o.out;
  const Outcome off = kvstream(
      "plan -m synthetic:llama3-8b:q4_0 -c 128k -ctk q8_0 -ctv q4_0 --kv-arena 2G "
      "--h2d-gbps 50 --no-phase-arena",
      "plan_off");
  ASSERT_EQ(off.status, 0) << off.err;
  EXPECT_FALSE(off.json["phase_arena"].get<bool>());
  EXPECT_EQ(off.json["arena_bytes"].get<size_t>(), (size_t{2} << 30) / page * page);
  EXPECT_LT(j["streamed_bytes_per_step"].get<size_t>(),
            off.json["streamed_bytes_per_step"].get<size_t>());
}

// plan --accept: drafts kept at P until the first rejection yield 1 + P + ... + P^k tokens a
// verify step, which streams what a one-token step streams (the pages cross once for all rows).
TEST_F(StreamCli, PlanPredictsDraftsOfAnAcceptance) {
  const std::string args =
      "plan -m synthetic:llama3-8b:q4_0 -c 128k -ctk q8_0 -ctv q4_0 --kv-arena 2G --h2d-gbps 50 "
      "--spec ngram --draft-max 3";
  const Outcome o = kvstream(args + " --accept 0.75", "plan_accept");
  ASSERT_EQ(o.status, 0) << o.err;
  const auto& d = o.json["drafts"];
  EXPECT_DOUBLE_EQ(d["tokens_per_step"].get<double>(), 1 + 0.75 + 0.5625 + 0.421875);
  EXPECT_EQ(d["streamed_bytes_per_step"], o.json["streamed_bytes_per_step"]);
  EXPECT_DOUBLE_EQ(d["step_s"].get<double>(), o.json["predicted_step_s"].get<double>());
  EXPECT_DOUBLE_EQ(d["tokens_per_s"].get<double>(),
                   d["tokens_per_step"].get<double>() / d["step_s"].get<double>());
  EXPECT_NE(o.out.find("drafts     3 a step, each kept at 0.75"), std::string::npos) << o.out;
  const Outcome all = kvstream(args + " --accept 1", "plan_accept_1");
  ASSERT_EQ(all.status, 0) << all.err;
  EXPECT_DOUBLE_EQ(all.json["drafts"]["tokens_per_step"].get<double>(), 4.0);
  // --gpu-ms: a measured device step replaces the bytes' model of T_gpu.
  const Outcome slow = kvstream(args + " --accept 0.75 --gpu-ms 500", "plan_gpu_ms");
  ASSERT_EQ(slow.status, 0) << slow.err;
  EXPECT_DOUBLE_EQ(slow.json["t_gpu_s"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(slow.json["predicted_step_s"].get<double>(), 0.5);
  EXPECT_EQ(slow.json["bound"], "gpu");
  EXPECT_NE(slow.out.find(" 500.000 ms (--gpu-ms)"), std::string::npos) << slow.out;
  const Outcome bad = kvstream(
      "plan -m synthetic:llama3-8b:q4_0 -c 128k --kv-arena 2G --accept 0.5", "plan_accept_bad");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("--accept"), std::string::npos) << bad.err;
}

// plan says which backend it predicts for, with that backend's bandwidths; a build without
// CUDA refuses to plan for it.
TEST_F(StreamCli, PlanIsForTheBackendAskedAbout) {
  const std::string args = "plan -m synthetic:smollm2-135m -c 4k --backend cpu";
  const Outcome cpu = kvstream(args, "plan_cpu");
  ASSERT_EQ(cpu.status, 0) << cpu.err;
  EXPECT_EQ(cpu.json["backend"], "cpu");
  EXPECT_NE(cpu.out.find("backend    cpu"), std::string::npos) << cpu.out;
  EXPECT_NE(cpu.out.find("T_cpu"), std::string::npos) << cpu.out;
  EXPECT_DOUBLE_EQ(cpu.json["hbm_gbps"].get<double>(), 20);
  const Outcome fast = kvstream(args + " --hbm-gbps 40", "plan_cpu_40");
  ASSERT_EQ(fast.status, 0) << fast.err;
  EXPECT_DOUBLE_EQ(fast.json["t_gpu_s"].get<double>() * 2, cpu.json["t_gpu_s"].get<double>());
  const Outcome cuda = kvstream("plan -m synthetic:smollm2-135m -c 4k --backend cuda", "plan_cuda");
  const Outcome dflt = kvstream("plan -m synthetic:smollm2-135m -c 4k", "plan_default");
  ASSERT_EQ(dflt.status, 0) << dflt.err;
  if (cuda.status == 0) {  // a CUDA build
    EXPECT_EQ(cuda.json["backend"], "cuda");
    EXPECT_DOUBLE_EQ(cuda.json["hbm_gbps"].get<double>(), 4400);
    EXPECT_GT(cuda.json["device_extra_bytes"].get<size_t>(), 0u);
    EXPECT_EQ(dflt.json["backend"], "cuda");
  } else {
    EXPECT_EQ(cuda.status, 1);
    EXPECT_NE(cuda.err.find("no CUDA backend"), std::string::npos) << cuda.err;
    EXPECT_EQ(dflt.json["backend"], "cpu");
  }
}

// qwen35's recurrent layers: a state per sequence beside the arena, counted with the buffers
// that --vram-limit must hold. The 27B: 48 Gated DeltaNet layers, each a conv tail of 3 rows of
// 10240 channels and 48 value heads' 128 x 128 states, in f32.
TEST_F(StreamCli, PlanCountsTheRecurrentStates) {
  const std::string args =
      "plan -m synthetic:qwen35-27b:iq4_xs -c 256k -ctk q8_0 -ctv q4_0 --h2d-gbps 50 "
      "--vram-limit 16G";
  const Outcome one = kvstream(args, "plan_qwen35");
  ASSERT_EQ(one.status, 0) << one.err;
  const size_t layer = (size_t{3} * 10240 + size_t{48} * 128 * 128) * 4;
  EXPECT_EQ(one.json["full_layers"].get<int>(), 16);
  EXPECT_EQ(one.json["recurrent_layers"].get<int>(), 48);
  EXPECT_EQ(one.json["recurrent_bytes"].get<size_t>(), 48 * layer);
  EXPECT_NE(one.out.find("48 recurrent (resident state"), std::string::npos) << one.out;
  // A prompt-cache checkpoint is a sequence's states, in host memory.
  EXPECT_EQ(one.json["checkpoint_bytes"].get<size_t>(), 48 * layer);
  const Outcome two = kvstream(args + " -np 2", "plan_qwen35_np2");
  ASSERT_EQ(two.status, 0) << two.err;
  EXPECT_EQ(two.json["recurrent_bytes"].get<size_t>(), 2 * 48 * layer);
  EXPECT_EQ(two.json["checkpoint_bytes"].get<size_t>(), 48 * layer);
  // The second sequence's states come out of the arena (beside the buffers of its rows).
  EXPECT_LE(two.json["arena_bytes"].get<size_t>() + 48 * layer,
            one.json["arena_bytes"].get<size_t>());
}

// bench on the CPU backend: ascending depths continue one sequence, every mode gets a row per
// depth, auto streams at the deepest one under a small arena, and --pair's sequences decode the
// same tokens together as alone. unified needs the CUDA backend and says so.
TEST(BenchCli, DepthSweepAndPairOnTheCpu) {
  const std::string base =
      "bench -m synthetic:tiny-qwen3 --depths 0,100,300 --n-gen 4 -b 64 --page-size 16 "
      "--pair 100,300 ";
  for (const char* mode : {"resident", "auto"}) {
    const std::string extra = std::string(mode) == "auto" ? "--kv-arena 160k --no-phase-arena" : "";
    const Outcome o =
        kvstream(base + "--modes " + mode + " " + extra, std::string("bench_") + mode);
    ASSERT_EQ(o.status, 0) << o.err;
    const auto& runs = o.json["runs"];
    ASSERT_EQ(runs.size(), 3u) << o.out;
    const int kDepths[] = {0, 100, 300};
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(runs[i]["depth"].get<int>(), kDepths[i]);
      EXPECT_GT(runs[i]["tg_tokens_per_s"].get<double>(), 0.0);
      EXPECT_GT(runs[i]["pp_tokens_per_s"].get<double>(), 0.0);
      const double busy = runs[i]["copy_busy_fraction"].get<double>();
      EXPECT_TRUE(busy >= 0.0 && busy <= 1.0) << busy;
    }
    const double streamed = runs[2]["streamed_bytes_per_token"].get<double>();
    if (std::string(mode) == "auto")
      EXPECT_GT(streamed, 0.0) << "300 tokens do not fit 160 KiB: pages must stream";
    else
      EXPECT_EQ(streamed, 0.0);
    const auto& pair = o.json["pairs"][0];
    EXPECT_TRUE(pair["same_tokens_as_alone"].get<bool>());
    EXPECT_EQ(pair["tokens_together"], pair["tokens_alone"]);
    EXPECT_EQ(pair["tokens_together"][0].size(), 4u);
    EXPECT_NE(o.out.find("same tokens as alone"), std::string::npos) << o.out;
  }
  // --fill random: the same sweep without prefilling, streaming at the deepest depth.
  const Outcome r =
      kvstream(base + "--modes auto --kv-arena 160k --no-phase-arena --fill random", "bench_fill");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.json["fill"], "random");
  ASSERT_EQ(r.json["runs"].size(), 3u) << r.out;
  EXPECT_GT(r.json["runs"][2]["streamed_bytes_per_token"].get<double>(), 0.0);
  EXPECT_TRUE(r.json["pairs"][0]["same_tokens_as_alone"].get<bool>());
  // -r: each figure the mean of its repetitions, with their standard deviation.
  const Outcome reps = kvstream(
      "bench -m synthetic:tiny --depths 0,40 --n-gen 3 -b 16 --page-size 16 -r 3", "bench_r");
  ASSERT_EQ(reps.status, 0) << reps.err;
  for (const auto& run : reps.json["runs"]) {
    EXPECT_EQ(run["repetitions"].get<int>(), 3);
    for (const char* t : {"tg", "pp"}) {
      const auto v = run[std::string(t) + "_tokens_per_s_reps"].get<std::vector<double>>();
      ASSERT_EQ(v.size(), 3u) << t;
      const double mean = (v[0] + v[1] + v[2]) / 3;
      EXPECT_NEAR(run[std::string(t) + "_tokens_per_s"].get<double>(), mean, 1e-9 * mean) << t;
      EXPECT_GE(run[std::string(t) + "_tokens_per_s_std"].get<double>(), 0.0) << t;
    }
  }
  EXPECT_NE(reps.out.find(" ± "), std::string::npos) << reps.out;
  EXPECT_NE(kvstream("bench -m synthetic:tiny -r 0", "bench_r0").status, 0);
  const Outcome bad = kvstream("bench -m synthetic:tiny --fill zeros", "bench_bad_fill");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("--fill"), std::string::npos) << bad.err;
  const Outcome u = kvstream("bench -m synthetic:tiny --modes unified --n-gen 2 -b 16", "bench_u");
  EXPECT_NE(u.status, 0);
  EXPECT_NE(u.err.find("unified needs the cuda backend"), std::string::npos) << u.err;
}

// --verify-tokens: at each depth, steps of k tokens with every token's logits, the drafts rolled
// back, timed beside the one-token step; streamed at the deepest depth, and on the hybrid
// qwen35 (recurrent layers rolled back) and gemma3 (window layers).
TEST(BenchCli, VerifyStepsAtDepths) {
  const Outcome o = kvstream(
      "bench -m synthetic:tiny-qwen3 --depths 0,300 --n-gen 3 -b 64 --page-size 16 --modes auto "
      "--kv-arena 160k --no-phase-arena --verify-tokens 1,3,5",
      "bench_verify");
  ASSERT_EQ(o.status, 0) << o.err;
  const auto& runs = o.json["runs"];
  ASSERT_EQ(runs.size(), 2u) << o.out;
  for (const auto& run : runs) {
    const auto& v = run["verify"];
    ASSERT_EQ(v.size(), 3u) << run.dump();
    const int kTokens[] = {1, 3, 5};
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(v[i]["tokens"].get<int>(), kTokens[i]);
      EXPECT_GT(v[i]["step_s"].get<double>(), 0.0);
      EXPECT_NEAR(v[i]["ratio_to_tg_step"].get<double>(),
                  v[i]["step_s"].get<double>() * run["tg_tokens_per_s"].get<double>(), 1e-9);
    }
  }
  EXPECT_GT(runs[1]["verify"][2]["streamed_bytes_per_step"].get<double>(), 0.0);
  EXPECT_NE(o.out.find("| verify5 | "), std::string::npos) << o.out;
  for (const char* m : {"tiny-qwen35", "tiny-gemma3"}) {
    const Outcome h = kvstream(std::string("bench -m synthetic:") + m +
                                   " --depths 40 --n-gen 3 -b 16 --page-size 16 --verify-tokens 4",
                               std::string("bench_verify_") + m);
    ASSERT_EQ(h.status, 0) << m << "\n" << h.err;
    EXPECT_EQ(h.json["runs"][0]["verify"][0]["tokens"].get<int>(), 4) << m;
  }
  const Outcome bad = kvstream("bench -m synthetic:tiny --verify-tokens 0", "bench_verify_bad");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("--verify-tokens"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace kvs
