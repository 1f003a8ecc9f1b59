// kvstream chat (and run -cnv) on SmolLM2: driven through a pipe, the second turn's greedy
// answer is what one run of the whole templated conversation gives (the KV kept between turns
// is exactly the conversation's tokens), with speculation as without; /stats, /clear, -sys, a
// full context; through a pty, Ctrl-C stops an answer and not the program, Ctrl-D quits with
// status 0.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "cli.h"
#include "kvs/gguf/gguf.h"
#include "kvs/tokenizer/tokenizer.h"

namespace kvs {
namespace {

using test::contains;
using test::kvstream;
using test::Outcome;

class Chat : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(test::smollm2())) GTEST_SKIP() << "no " << test::smollm2();
  }
  const std::string m = " -m " + test::smollm2() + " ";
  // A chat through a pipe with --json; the JSON in *j.
  Outcome chat(const std::string& flags, const std::string& input, nlohmann::json* j) {
    const auto js = test::temp_dir("cli") / "chat.json";
    std::filesystem::remove(js);
    Outcome o = kvstream("chat" + m + flags + " --json " + js.string(), input);
    EXPECT_EQ(o.status, 0) << flags << "\n" << o.err;
    if (std::filesystem::exists(js)) *j = nlohmann::json::parse(test::slurp(js));
    return o;
  }
};

int count(const std::string& s, const std::string& needle) {
  int n = 0;
  for (size_t at = s.find(needle); at != std::string::npos; at = s.find(needle, at + 1)) ++n;
  return n;
}

TEST_F(Chat, SecondTurnContinuesTheKvExactly) {
  nlohmann::json j;
  const Outcome o = chat("--temp 0 -n 24 -c 1024",
                         "What is the capital of France?\n/stats\nAnd of Italy?\n/stats\n", &j);
  ASSERT_EQ(j["messages"].size(), 4u) << j.dump();
  EXPECT_EQ(count(o.out, "context: "), 2) << o.out;
  EXPECT_NE(o.out.rfind("> ", 0), 0u) << "no prompt decoration through a pipe";
  EXPECT_TRUE(contains(o.out, "tokens of -c 1024 used")) << o.out;
  EXPECT_TRUE(contains(o.out, "streamed: ")) << o.out;
  EXPECT_TRUE(contains(o.out, "tok/s")) << o.out;
  const auto& turns = j["turns"];
  ASSERT_EQ(turns.size(), 2u);
  EXPECT_GT(turns[1]["reused_tokens"].get<int>(), 16) << "the second turn kept the first's KV";

  // The whole conversation through the template, as one prompt.
  auto f = gguf::File::open(test::smollm2());
  auto tok = Tokenizer::from_gguf(*f);
  std::vector<ChatMessage> msgs;
  for (int i = 0; i < 3; ++i)
    msgs.push_back({j["messages"][i]["role"], j["messages"][i]["content"]});
  const std::vector<int32_t> ids = tok->encode(tok->apply_chat(msgs), true, true);
  const std::vector<int32_t> kv = j["kv_tokens"];
  ASSERT_LE(kv.size(), ids.size() + 24);
  EXPECT_TRUE(std::equal(ids.begin(), ids.end(), kv.begin()))
      << "the KV begins with the templated conversation's tokens";
  std::string list;
  for (int32_t id : ids) {
    if (!list.empty()) list += ',';
    list += std::to_string(id);
  }
  const auto js = test::temp_dir("cli") / "whole.json";
  const Outcome run =
      kvstream("run" + m + "--tokens " + list + " -n 24 -c 1024 --temp 0 --json " + js.string());
  ASSERT_EQ(run.status, 0) << run.err;
  const auto r = nlohmann::json::parse(test::slurp(js));
  EXPECT_EQ(r["text"], j["messages"][3]["content"]);
}

TEST_F(Chat, ClearStartsANewConversation) {
  nlohmann::json j;
  const Outcome o = chat("--temp 0 -n 12 -c 512", "Hi\n/clear\nHi\n/stats\n", &j);
  ASSERT_EQ(j["messages"].size(), 2u) << j.dump();
  const std::string a = j["messages"][1]["content"];
  EXPECT_EQ(o.out.rfind(a + "\n" + a + "\n", 0), 0u) << o.out;
  ASSERT_EQ(j["turns"].size(), 2u);
  EXPECT_EQ(j["turns"][1]["reused_tokens"], 0);
  EXPECT_EQ(j["turns"][1]["prompt_tokens"], j["turns"][0]["prompt_tokens"]);
  EXPECT_TRUE(contains(o.out, "0 tokens reused")) << o.out;
}

// /save NAME and /load NAME: a later chat takes the conversation and its KV back (the next
// message reads only its own tokens) and answers as the chat that never stopped; a file that
// is not there or not a slot file is said and the chat goes on.
TEST_F(Chat, SaveAndLoadKeepTheConversation) {
  const auto dir = test::temp_dir("chat_save");
  const std::string name = (dir / "conv").string();
  std::filesystem::remove(name + ".json");
  std::filesystem::remove(name + ".kvslot");
  nlohmann::json whole, first, second;
  chat("--temp 0 -n 16 -c 1024", "What is the capital of France?\nAnd of Italy?\n", &whole);
  Outcome o = chat("--temp 0 -n 16 -c 1024", "What is the capital of France?\n/save " + name + "\n",
                   &first);
  EXPECT_TRUE(contains(o.err, "saved ")) << o.err;
  ASSERT_TRUE(std::filesystem::exists(name + ".kvslot")) << o.err;
  o = chat("--temp 0 -n 16 -c 1024",
           "/load " + (dir / "none").string() + "\n/load " + name + "\nAnd of Italy?\n", &second);
  EXPECT_TRUE(contains(o.err, "cannot read")) << o.err;
  EXPECT_TRUE(contains(o.err, "loaded ")) << o.err;
  ASSERT_EQ(second["messages"].size(), 4u) << second.dump();
  EXPECT_EQ(second["messages"], whole["messages"]);
  ASSERT_EQ(second["turns"].size(), 1u);
  EXPECT_GT(second["turns"][0]["reused_tokens"].get<int>(), 16) << "the loaded KV was reused";
}

TEST_F(Chat, SystemPromptAndRunConversation) {
  nlohmann::json j;
  const Outcome sys = chat("--temp 0 -n 8 -c 512 -sys \"You are a pirate.\"", "Hi\n", &j);
  ASSERT_EQ(j["messages"].size(), 3u) << j.dump();
  EXPECT_EQ(j["messages"][0]["role"], "system");
  EXPECT_EQ(j["messages"][0]["content"], "You are a pirate.");
  // run -cnv / -i is the same chat.
  const Outcome plain = chat("--temp 0 -n 8 -c 512", "Hi\nBye\n", &j);
  // llama-cli's `llama-cli -m model.gguf`: no prompt starts the conversation too.
  for (const char* flag : {"-cnv", "-i", "--conversation", "--interactive", ""}) {
    const Outcome o = kvstream("run" + m + flag + " --temp 0 -n 8 -c 512", "Hi\nBye\n");
    EXPECT_EQ(o.status, 0) << flag << "\n" << o.err;
    EXPECT_EQ(o.out, plain.out) << flag;
  }
  // llama-cli -m model.gguf -sys "You are a helpful assistant"
  const Outcome helpful =
      kvstream("run" + m + "-sys \"You are a helpful assistant\" -n 8 -c 512", "Hi\n");
  EXPECT_EQ(helpful.status, 0) << helpful.err;
  EXPECT_FALSE(helpful.out.empty());
  // -p with -cnv is the first message.
  const Outcome first = kvstream("run" + m + "-cnv -p Hi --temp 0 -n 8 -c 512", "Bye\n");
  EXPECT_EQ(first.status, 0) << first.err;
  EXPECT_EQ(first.out, plain.out);
}

TEST_F(Chat, AFullContextIsSaidAndTheSessionGoesOn) {
  std::string lines;
  for (int i = 0; i < 40; ++i) lines += "many words ";
  nlohmann::json j;
  Outcome o = chat("--temp 0 -n 8 -c 64", lines + "\nHi\n", &j);
  EXPECT_TRUE(contains(o.err, "more than the context holds (-c 64")) << o.err;
  EXPECT_EQ(j["messages"].size(), 2u) << "the too long message left out, the next answered";
  // An answer that fills the context stops there; /clear makes room again.
  o = chat("--temp 0 -n -1 --ignore-eos -c 48", "Hi\nHi again\n/clear\nHi\n", &j);
  EXPECT_TRUE(contains(o.err, "the context is full (-c 48)")) << o.err;
  EXPECT_TRUE(contains(o.err, "more than the context holds")) << o.err;
  EXPECT_EQ(j["messages"].size(), 2u) << j.dump();
}

// --spec ngram, and a draft model: the answers of plain decoding, token for token (the KV too,
// where each turn's rejected drafts were rolled back), drafts accepted; and a context filled by
// a verify step.
TEST_F(Chat, SpeculationGivesTheAnswersOfPlainDecoding) {
  const std::string input =
      "Repeat this twice: The quick brown fox jumps over the lazy dog.\n/stats\nAgain, "
      "three times.\n/stats\n";
  nlohmann::json off, on;
  chat("--temp 0 -n 48 -c 1024", input, &off);
  const Outcome o = chat("--temp 0 -n 48 -c 1024 --spec ngram --draft-max 6", input, &on);
  ASSERT_EQ(on["messages"].size(), 4u) << on.dump();
  EXPECT_EQ(on["messages"], off["messages"]);
  EXPECT_EQ(on["kv_tokens"], off["kv_tokens"]);
  int64_t drafted = 0, accepted = 0;
  for (const auto& t : on["turns"]) {
    drafted += t["drafted"].get<int64_t>();
    accepted += t["accepted"].get<int64_t>();
  }
  EXPECT_GT(accepted, 5) << on.dump();
  EXPECT_LT(accepted, drafted);
  EXPECT_EQ(count(o.out, " accepted"), 2) << o.out;
  // A draft model (SmolLM2 drafting for itself) following the conversation across turns.
  nlohmann::json draft;
  chat("--temp 0 -n 48 -c 1024 -md " + test::smollm2() + " --draft-p-min 0.3", input, &draft);
  EXPECT_EQ(draft["messages"], off["messages"]);
  EXPECT_EQ(draft["kv_tokens"], off["kv_tokens"]);
  drafted = accepted = 0;
  for (const auto& t : draft["turns"]) {
    drafted += t["drafted"].get<int64_t>();
    accepted += t["accepted"].get<int64_t>();
  }
  EXPECT_GT(drafted, 20) << draft.dump();
  // The same model drafts, so only near-ties between its one-token steps and the target's
  // verify batches reject; how many depends on the prompt (SmolLM2's template's own system
  // prompt).
  EXPECT_GE(accepted, drafted * 3 / 4) << draft.dump();
  nlohmann::json full;
  const Outcome f = chat("--temp 0 -n -1 --ignore-eos -c 48 --spec ngram", "Hi\n", &full);
  EXPECT_TRUE(contains(f.err, "the context is full (-c 48)")) << f.err;
  EXPECT_EQ(full["kv_tokens"].size(), 48u);
}

TEST_F(Chat, CtrlCStopsAnAnswerAndCtrlDQuits) {
  const nlohmann::json r = test::drive_tty("chat", test::smollm2());
  EXPECT_EQ(r["status"], 0) << r.dump();
  for (const char* step :
       {"prompt1", "answer1", "answer2_started", "stopped", "answer3", "prompt_after_ctrl_c"})
    EXPECT_TRUE(r["steps"][step].get<bool>()) << step << "\n" << r.dump();
  const std::string out = r["output"];
  EXPECT_TRUE(contains(out, "answer stopped (Ctrl-C)")) << out;
  // The first prompt, one after each answer and one after the Ctrl-C at the prompt.
  EXPECT_EQ(count(out, "\n> "), 5) << out;
}

}  // namespace
}  // namespace kvs
