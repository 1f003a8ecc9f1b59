// The command line as people arriving from llama.cpp type it: its multi-letter flags, size
// suffixes, -n -1, -c 0, the thread cap, limits before allocations, exit codes, the prefill
// progress line and Ctrl-C during a run.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli.h"

namespace kvs {
namespace {

using test::contains;
using test::kvstream;
using test::Outcome;

const std::string kTiny = "run -m synthetic:tiny --tokens 1,2,3 --temp 0 ";

void expect_ok(const Outcome& o, const std::string& what) {
  EXPECT_EQ(o.status, 0) << what << "\n" << o.err;
}
void expect_error(const std::string& args, const std::string& needle) {
  const Outcome o = kvstream(args);
  EXPECT_EQ(o.status, 1) << args << "\n" << o.err;
  EXPECT_TRUE(contains(o.err, needle)) << args << "\nstderr: " << o.err;
}

class SmolLM2 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(test::smollm2())) GTEST_SKIP() << "no " << test::smollm2();
  }
  const std::string m = " -m " + test::smollm2() + " ";
};

// Command lines from llama.cpp's README (llama-cli), with kvstream run for llama-cli.
TEST_F(SmolLM2, LlamaCppCommandLinesRunUnchanged) {
  Outcome o = kvstream("run" + m +
                       "-p \"I believe the meaning of life is\" -n 32 -ngl 99 -fa on -c 4096 -t 2 "
                       "--temp 0");
  expect_ok(o, "-ngl 99 -fa on");
  EXPECT_FALSE(o.out.empty());
  const bool cpu_only =
      contains(kvstream("run -m synthetic:tiny --tokens 1 -n 1 --backend cuda").err, "no CUDA");
  if (cpu_only) {
    EXPECT_TRUE(contains(o.err, "-ngl 99")) << "a CPU build says -ngl runs on the CPU\n" << o.err;
  }
  // The same greedy text as without the llama.cpp flags.
  const Outcome plain =
      kvstream("run" + m + "-p \"I believe the meaning of life is\" -n 32 -c 4096 --temp 0");
  expect_ok(plain, "plain");
  EXPECT_EQ(o.out, plain.out);

  o = kvstream("run" + m + "-p \"I believe the meaning of life is\" -n 32 -no-cnv --temp 0");
  expect_ok(o, "-no-cnv");
  EXPECT_EQ(o.out, plain.out);
  expect_error("run -m synthetic:tiny -no-cnv -n 1", "exactly one");
  expect_ok(kvstream("run" + m + "-p \"Hello\" -n 8 -ctk q8_0 -ctv q4_0 -c 512"), "-ctk -ctv");
  expect_ok(kvstream("run" + m + "-p \"Hello\" -n 8 -ngl 0 -fa -c 512"), "-fa without value");
  o = kvstream("run" + m + "-p \"Hello\" -n -1 -c 256 --temp 0");
  expect_ok(o, "-n -1 -c 256");
  o = kvstream("run" + m + "-p \"Hello\" -n 4 -c 0");
  expect_ok(o, "-c 0");
  EXPECT_TRUE(contains(o.err, "KV at -c 8192")) << "-c 0: SmolLM2's trained context\n" << o.err;
  o = kvstream("run" + m + "-p \"Hello\" -n 4 -np 2 -c 256 --temp 0");
  expect_ok(o, "-np 2");
  EXPECT_TRUE(contains(o.out, "[1] ") && contains(o.out, "[2] ")) << o.out;
}

// llama-cli's -e, -r, --color, --no-display-prompt, -st and -sm: -e reads escapes, -r ends the
// text at its first reverse prompt (kept), the others change nothing in kvstream's output.
TEST_F(SmolLM2, LlamaCliFlagsOfIssue44) {
  const std::string p = "run" + m + "--temp 0 -c 512 ";
  const Outcome plain = kvstream(p + "-n 48 -p \"Count: 1, 2, 3,\"");
  expect_ok(plain, "plain");
  const size_t at = plain.out.find('7');
  ASSERT_NE(at, std::string::npos) << plain.out;
  const Outcome r =
      kvstream(p + "-n 48 -p \"Count: 1, 2, 3,\" -r 7 --color --no-display-prompt -sm none");
  expect_ok(r, "-r 7");
  EXPECT_EQ(r.out.substr(0, r.out.find('7') + 1), plain.out.substr(0, at + 1));
  EXPECT_EQ(r.out.find_last_not_of('\n'), r.out.find('7'))
      << "the text ends at the reverse prompt: " << r.out;
  const Outcome nl = kvstream(p + "-n 4 -p \"a\nb\"");
  const Outcome e = kvstream(p + "-n 4 -e -p 'a\\nb'");
  expect_ok(e, "-e");
  const Outcome raw = kvstream(p + "-n 4 -p 'a\\nb'");
  EXPECT_EQ(e.out, nl.out) << "-e reads \\n as a newline";
  EXPECT_NE(raw.out, e.out) << "without -e the backslash stays";
  const Outcome st = kvstream(p + "-n 8 -st -p Hi");
  expect_ok(st, "-st");
  EXPECT_EQ(st.out, kvstream(p + "-n 8 --chat -p Hi").out) << "-st: one chat turn";
  expect_error(p + "-n 1 -p Hi -sm sideways", "--split-mode");
}

TEST_F(SmolLM2, SystemPromptFlagsAgree) {
  auto prompt_tokens = [&](const std::string& flags) {
    const auto js = test::temp_dir("cli") / "sys.json";
    const Outcome o = kvstream("run" + m + "--chat -p hi -n 0 " + flags + " --json " + js.string());
    EXPECT_EQ(o.status, 0) << flags << "\n" << o.err;
    return nlohmann::json::parse(test::slurp(js))["prompt_tokens"];
  };
  const auto none = prompt_tokens("");
  const auto sys = prompt_tokens("-sys \"You are a pirate.\"");
  // SmolLM2's template gives its own system prompt where none is given: -sys replaces it.
  EXPECT_NE(sys, none);
  EXPECT_EQ(prompt_tokens("--system-prompt \"You are a pirate.\""), sys);
  EXPECT_EQ(prompt_tokens("--system \"You are a pirate.\""), sys);
}

// llama-cli's template flags in run and chat: a template by name, from a file, without Jinja.
TEST_F(SmolLM2, ChatTemplateFlagsInRunAndChat) {
  auto prompt_tokens = [&](const std::string& cmd) {
    const auto js = test::temp_dir("cli") / "tmpl.json";
    const Outcome o = kvstream(cmd + " --json " + js.string());
    EXPECT_EQ(o.status, 0) << cmd << "\n" << o.err;
    return nlohmann::json::parse(test::slurp(js))["prompt_tokens"];
  };
  const auto file = test::temp_dir("cli") / "bang.jinja";
  {
    std::ofstream(file) << "{% for m in messages %}{{ m.content }}!{% endfor %}";
  }
  // The file's template renders "hi!", which is what a plain prompt of "hi!" reads.
  EXPECT_EQ(prompt_tokens("run" + m + "--chat -p hi -n 0 --chat-template-file " + file.string()),
            prompt_tokens("run" + m + "-p hi! -n 0"));
  const auto own = prompt_tokens("run" + m + "--chat -p hi -n 0");
  const auto llama3 = prompt_tokens("run" + m + "--chat -p hi -n 0 --chat-template llama3");
  EXPECT_NE(llama3, own);
  EXPECT_NE(prompt_tokens("run" + m + "--chat -p hi -n 0 --no-jinja --chat-template llama3"),
            own);
  const Outcome bad = kvstream("run" + m + "--chat -p hi -n 0 --chat-template nosuch");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("chatml"), std::string::npos) << bad.err;
  const Outcome chat = kvstream("chat" + m + "-n 2 --chat-template-file " + file.string(), "hi\n");
  EXPECT_EQ(chat.status, 0) << chat.err;
}

TEST(LlamaFlags, GpuLayersChooseTheBackend) {
  expect_ok(kvstream(kTiny + "-n 2 -ngl 0"), "-ngl 0");
  expect_ok(kvstream(kTiny + "-n 2 --n-gpu-layers 0 --backend cpu"), "--n-gpu-layers 0");
  expect_error(kTiny + "-n 2 -ngl 99 --backend cpu", "-ngl 99");
  expect_error(kTiny + "-n 2 -ngl 0 --backend cuda", "--backend cuda");
  expect_error(kTiny + "-n 2 -ngl -5", "-ngl");
  const Outcome help = kvstream("run --help");
  EXPECT_TRUE(contains(help.out, "-ngl N")) << help.out;
}

TEST(LlamaFlags, FlashAttentionIsAccepted) {
  for (const char* v : {"-fa", "-fa on", "-fa auto", "--flash-attn", "--flash-attn on"})
    expect_ok(kvstream(kTiny + "-n 2 " + v), v);
  const Outcome off = kvstream(kTiny + "-n 2 -fa off");
  expect_ok(off, "-fa off");
  EXPECT_TRUE(contains(off.err, "-fa off is ignored")) << off.err;
  expect_error(kTiny + "-n 2 --flash-attn=maybe", "--flash-attn");
  // -fa before another flag takes no value from it.
  expect_ok(kvstream("run -m synthetic:tiny -fa -n 2 --tokens 1,2"), "-fa -n");
}

TEST(LlamaFlags, ParallelAndCacheTypesEverywhere) {
  expect_ok(kvstream(kTiny + "-n 2 -np 2"), "run -np 2");
  expect_ok(kvstream(kTiny + "-n 2 --parallel 2"), "run --parallel 2");
  Outcome o = kvstream("plan -m synthetic:tiny -c 8k -np 3 -ctk q8_0 -ctv q4_0");
  expect_ok(o, "plan -np -ctk -ctv");
  EXPECT_TRUE(contains(o.out, "8192 tokens x 3 sequence(s)")) << o.out;
  EXPECT_TRUE(contains(o.out, "q8_0/q4_0")) << o.out;
  o = kvstream("bench -m synthetic:tiny --depths 0 --n-gen 2 -p 8 -ctk q8_0 -ctv q8_0 -ngl 0 -fa");
  expect_ok(o, "bench -ctk -ctv -ngl -fa");
  EXPECT_TRUE(contains(o.out, "q8_0/q8_0")) << o.out;
  expect_ok(kvstream("info -m synthetic:tiny -ctk q8_0 -ctv q4_0"), "info -ctk -ctv");
}

TEST(LlamaFlags, SizeSuffixesWhereverTokensAreCounted) {
  Outcome o = kvstream(kTiny + "-n 1k -c 32k -b 1k --page-size 1k --ignore-eos");
  expect_ok(o, "run suffixes");
  EXPECT_TRUE(contains(o.err, "KV at -c 32768")) << o.err;
  EXPECT_TRUE(contains(o.err, "decode 1023 tokens")) << o.err;
  o = kvstream("bench -m synthetic:tiny --depths 1k --n-gen 1k -p 1k -b 1k");
  expect_ok(o, "bench suffixes");
  EXPECT_TRUE(contains(o.out, "| 1024 | tg1024 |")) << o.out;
  EXPECT_TRUE(contains(o.out, "| pp1024 |")) << o.out;
  o = kvstream("plan -m synthetic:tiny -c 1m -b 2k --page-size 512");
  expect_ok(o, "plan suffixes");
  EXPECT_TRUE(contains(o.out, "1048576 tokens")) << o.out;
  expect_error(kTiny + "-n 1 -c 32q", "-c/--ctx-size");
}

TEST(LlamaFlags, PredictUntilTheEndAndTrainedContext) {
  // -n -1: until the context is full (the prompt's 3 tokens leave 61 of -c 64).
  Outcome o = kvstream(kTiny + "-n -1 -c 64 --ignore-eos");
  expect_ok(o, "-n -1");
  EXPECT_TRUE(contains(o.err, "decode 60 tokens")) << o.err;
  expect_error(kTiny + "-n -2", "-n/--n-predict");
  expect_error(kTiny + "-n -1 -c 3", "leaves no room");
  // -c 0: the model's trained context (synthetic:tiny says 4096).
  o = kvstream(kTiny + "-n 1 -c 0");
  expect_ok(o, "-c 0");
  EXPECT_TRUE(contains(o.err, "KV at -c 4096")) << o.err;
}

TEST(LlamaFlags, ThreadsAreCappedAtTheHardware) {
  const Outcome o = kvstream(kTiny + "-n 4 -t 10000");
  expect_ok(o, "-t 10000");
  EXPECT_TRUE(contains(o.err, "-t 10000 is more than the")) << o.err;
  EXPECT_FALSE(contains(o.err, "10000 threads")) << o.err;
}

TEST(CliLimits, HugeValuesAreClearErrors) {
  expect_error(kTiny + "-n 1 --parallel 2147483647", "4096");
  expect_error(kTiny + "-n 1 -np 2147483647", "--parallel");
  expect_error(kTiny + "-n 1 -b 2000000000", "-b/--batch-size");
  expect_error(kTiny + "-n 1 -c 3000000000", "-c/--ctx-size");
  expect_error(kTiny + "-n 1 -c 2000000000", "-c/--ctx-size");
  expect_error(kTiny + "-n 1 -c 2000000000 --kv-mode resident", "-c/--ctx-size");
  expect_error(kTiny + "-n 1 -c 1000000000 -np 64 -b 64", "-np/--parallel 64");
  expect_error(kTiny + "-n 1 --page-size 100000", "--page-size");
  expect_error(kTiny + "-n 1 --ring-chunk 100G", "--ring-chunk");
  expect_error(kTiny + "-n 1 --ring-slots 2000000", "--ring-slots");
  expect_error("bench -m synthetic:tiny --depths 2000000000 --n-gen 1m -r 200", "--depths");
  expect_error("bench -m synthetic:tiny --n-gen 100m", "--n-gen");
  expect_error("plan -m synthetic:tiny -np 2147483647", "--parallel");
}

TEST(CliLimits, ExitCodesAndUsage) {
  expect_error("run -m synthetic:tiny --bogus", "--bogus");
  expect_error("run -p hi", "--model");
  expect_error("", "subcommand");
  expect_error("nosuch", "'nosuch' is not a command (run, chat");
  expect_error("bench -m synthetic:tiny --modes bogus", "--modes");
  expect_error("bench -m synthetic:tiny -r 0", "--repetitions");
  for (const char* sub : {"run", "chat", "bench", "plan", "info", "synth"}) {
    const Outcome o = kvstream(std::string(sub) + " --help");
    EXPECT_EQ(o.status, 0) << sub;
    EXPECT_TRUE(contains(o.out, std::string("Usage: kvstream ") + sub + " ")) << o.out;
  }
  EXPECT_EQ(kvstream("--help").status, 0);
  EXPECT_EQ(kvstream("--version").status, 0);
}

TEST(CliLimits, OneTokenIsSingular) {
  const Outcome o = kvstream("run -m synthetic:tiny --tokens 1 -n 2 --temp 0 --ignore-eos");
  expect_ok(o, "one token");
  EXPECT_TRUE(contains(o.err, "1 prompt token,")) << o.err;
  EXPECT_TRUE(contains(o.err, "prefill 1 token ")) << o.err;
  EXPECT_TRUE(contains(o.err, "decode 1 token ")) << o.err;
  EXPECT_FALSE(contains(o.err, " 1 tokens")) << o.err;
}

std::string long_prompt() {
  const auto path = test::temp_dir("cli") / "long.txt";
  std::ofstream f(path);
  for (int i = 0; i < 600; ++i) f << "word ";
  return path.string();
}

TEST(Progress, PrefillShowsProgressOnATerminalOnly) {
  const std::string args = "run -m synthetic:tiny -f " + long_prompt() + " -n 1 -b 16";
  const nlohmann::json tty = test::drive_tty("progress", args);
  ASSERT_EQ(tty["status"], 0) << tty.dump();
  const std::string err = tty["stderr"];
  EXPECT_TRUE(contains(err, "kvstream: prefill ")) << err;
  EXPECT_TRUE(contains(err, "tok/s, ETA ")) << err;
  const Outcome file = kvstream(args);
  expect_ok(file, "stderr to a file");
  EXPECT_FALSE(contains(file.err, "ETA")) << file.err;
  EXPECT_FALSE(contains(file.err, "\r")) << file.err;
}

// A model without a chat template (Gemma 3 270M, a base model) gets no guessed one, as in
// llama.cpp: --chat is a plain completion of the prompt and chat continues the text, each with
// one line saying so.
TEST(NoChatTemplate, ChatIsAPlainCompletion) {
  const std::string g = test::gemma3_270m();
  if (!std::filesystem::exists(g)) GTEST_SKIP() << "no " << g;
  const std::string run = "run -m " + g + " -p \"The capital of France is\" -n 6 --temp 0 -c 256";
  const Outcome plain = kvstream(run), chat = kvstream(run + " --chat");
  expect_ok(plain, "run");
  expect_ok(chat, "run --chat");
  EXPECT_EQ(chat.out, plain.out);
  EXPECT_FALSE(contains(plain.err, "chat template")) << plain.err;
  EXPECT_TRUE(contains(chat.err, "has no chat template: --chat runs a plain completion"))
      << chat.err;
  EXPECT_EQ(chat.err.find("chat template"), chat.err.rfind("chat template")) << "one notice";
  const Outcome c =
      kvstream("chat -m " + g + " --temp 0 -n 6 -c 256", "The capital of France is\n");
  expect_ok(c, "chat");
  EXPECT_TRUE(contains(c.err, "has no chat template: each message continues the text")) << c.err;
  EXPECT_TRUE(contains(c.out, plain.out.substr(plain.out.find_first_not_of(' ')))) << c.out;
}

// bench's untimed fill and its timed decode and prefill each show their progress.
TEST(Progress, BenchShowsTheFillDecodeAndPrefill) {
  const nlohmann::json tty = test::drive_tty(
      "progress", "bench -m synthetic:tiny --depths 300 --n-gen 8 -p 32 -b 16 -r 2");
  ASSERT_EQ(tty["status"], 0) << tty.dump();
  const std::string err = tty["stderr"];
  for (const char* what : {"kvstream: auto fill to 300 ", "kvstream: auto at 300: decode ",
                           "kvstream: auto at 300: prefill "})
    EXPECT_TRUE(contains(err, what)) << what << " in " << err;
}

TEST_F(SmolLM2, CtrlCStopsARunWithItsSummary) {
  const nlohmann::json r =
      test::drive_tty("sigint", "run" + m + "-p \"Tell me a story.\" -n 2000 -c 2100 --ignore-eos");
  EXPECT_EQ(r["status"], 130) << r.dump();
  const std::string err = r["stderr"];
  EXPECT_TRUE(contains(err, "interrupted (Ctrl-C)")) << err;
  EXPECT_TRUE(contains(err, "kvstream: load ")) << err;
  EXPECT_TRUE(contains(err, "| decode ")) << err;
  EXPECT_FALSE(contains(err, "decode 1999 tokens")) << err;
}

}  // namespace
}  // namespace kvs
