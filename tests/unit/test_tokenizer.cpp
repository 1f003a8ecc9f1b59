// Tokenizer tests: byte-level BPE against HuggingFace `tokenizers` (tokenizer_ref.py) for the
// SmolLM2 vocab and the synthetic vocab, SentencePiece against tools/reference.py on Gemma 3's
// vocab and segmentations checked by hand, round trips, streaming detokenization and chat
// templates.
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "kvs/gguf/gguf.h"
#include "kvs/tokenizer/tokenizer.h"
#include "kvs/tokenizer/vocab.h"
#include "kvs/util/error.h"

namespace kvs {
namespace {

using json = nlohmann::json;

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

bool exists(const std::string& p) {
  return !p.empty() && std::ifstream(p).good();
}

std::string source_dir() {
  const std::string s = env_or_empty("KVS_SOURCE_DIR");
  return s.empty() ? KVS_TEST_SOURCE_DIR : s;
}

// KVS_PYTHON, else the project's .venv (what tests/CMakeLists.txt would pass); empty if none.
std::string python() {
  const std::string p = env_or_empty("KVS_PYTHON");
  if (!p.empty()) return p;
  const std::string venv = source_dir() + "/.venv/bin/python3";
  return exists(venv) ? venv : "";
}

std::string smollm_path() {
  std::string dir = env_or_empty("KVS_MODEL_DIR");
  if (dir.empty()) dir = source_dir() + "/models";
  const std::string p = dir + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  return exists(p) ? p : "";
}

std::string gemma3_path() {
  std::string dir = env_or_empty("KVS_MODEL_DIR");
  if (dir.empty()) dir = source_dir() + "/models";
  const std::string p = dir + "/gemma-3-270m-q4_k_m.gguf";
  return exists(p) ? p : "";
}

std::string long_text() {
  std::string s;
  for (int i = 0; i < 200; ++i) {
    s += "Paragraph " + std::to_string(i) +
         ": The model streams its key-value cache between GPU and host memory, "
         "and the scheduler decides which blocks stay resident. Café, naïve, jalapeño; "
         "東京は晴れ。 🚀🔥 x = f(y) * 3.5e-3;\n    return {a, b};\n\n";
  }
  return s;
}

std::vector<std::string> texts() {
  return {
      "Hello world",
      "The quick brown fox jumps over the lazy dog.",
      "café, über, niño, Ångström, façade",
      "日本語のテキストと中文文本，한국어도",
      "emoji 😀 👍🏽 family 👨‍👩‍👧‍👦 flag 🇫🇷",
      "def f(x):\n    if x > 0:\n        return x * 2\n    return -x\n",
      "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\treturn v[0];\n}\n",
      "1234567 3.14159 -42 1e10 0x1F 2024-01-01",
      "a   b\n\n\t c",
      "trailing spaces   ",
      "   leading spaces",
      "\n\n\n",
      "It's we're they've I'm you'll he'd SHE'S",
      "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
      "",
      " ",
      "mixed<|endoftext|>special<|im_end|>",
      long_text(),
  };
}

// Runs tokenizer_ref.py on a request; empty json when Python is not configured.
json run_ref(const json& req) {
  const std::string py = python(), src = source_dir();
  if (py.empty()) return {};
  char in[] = "/tmp/kvs_tokref_XXXXXX";
  const int fd = mkstemp(in);
  EXPECT_GE(fd, 0);
  close(fd);
  std::ofstream(in) << req.dump();
  const std::string cmd =
      "'" + py + "' '" + src + "/tests/unit/tokenizer_ref.py' '" + std::string(in) + "'";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[65536];
  for (size_t n; p && (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int rc = p ? pclose(p) : -1;
  std::remove(in);
  EXPECT_EQ(rc, 0) << cmd;
  return rc == 0 ? json::parse(out) : json{};
}

tok::VocabData synthetic_data(int32_t n, const std::string& pre) {
  const SyntheticVocab s = make_synthetic_vocab(n);
  tok::VocabData v;
  v.model = s.model;
  v.pre = pre;
  v.tokens = s.tokens;
  v.types = s.types;
  v.merges = s.merges;
  v.bos = s.bos;
  v.eos = s.eos;
  v.chat_template = s.chat_template;
  return v;
}

// Every text: ids equal the reference's and decoding gives the text back.
void expect_same_as_ref(const Tokenizer& t, const json& ref, const std::string& what) {
  ASSERT_TRUE(ref.contains("ids")) << what;
  const auto all = texts();
  ASSERT_EQ(ref["ids"].size(), all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    const auto ids = t.encode(all[i], false, true);
    EXPECT_EQ(ids, ref["ids"][i].get<std::vector<int32_t>>())
        << what << " text " << i << ": " << all[i].substr(0, 80);
    EXPECT_EQ(t.decode(ids, true), all[i]) << what << " text " << i;
  }
}

TEST(Tokenizer, SyntheticVocabIsValid) {
  for (int32_t n : {300, 1000, 4096, 32000}) {
    const SyntheticVocab v = make_synthetic_vocab(n);
    ASSERT_EQ(static_cast<int32_t>(v.tokens.size()), n);
    ASSERT_EQ(v.types.size(), v.tokens.size());
    std::set<std::string> seen(v.tokens.begin(), v.tokens.end());
    EXPECT_EQ(seen.size(), v.tokens.size()) << "duplicate tokens at n=" << n;
    for (const std::string& m : v.merges) {
      const size_t sp = m.find(' ', 1);
      ASSERT_NE(sp, std::string::npos) << m;
      EXPECT_TRUE(seen.count(m.substr(0, sp)) && seen.count(m.substr(sp + 1)) &&
                  seen.count(m.substr(0, sp) + m.substr(sp + 1)))
          << "merge '" << m << "' at n=" << n;
    }
    EXPECT_EQ(v.tokens[static_cast<size_t>(v.bos)], "<|endoftext|>");
  }
  // Deterministic.
  EXPECT_EQ(make_synthetic_vocab(2000).merges, make_synthetic_vocab(2000).merges);
  EXPECT_THROW(make_synthetic_vocab(299), Error);
}

TEST(Tokenizer, SyntheticMatchesHuggingFace) {
  if (python().empty()) GTEST_SKIP() << "no KVS_PYTHON";
  for (const char* pre : {"gpt2", "smollm", "llama3", "qwen2"}) {
    const tok::VocabData v = synthetic_data(3000, pre);
    const auto t = tok::make_tokenizer(v);
    const json ref =
        run_ref({{"vocab", {{"tokens", v.tokens}, {"types", v.types}, {"merges", v.merges}}},
                 {"pre", pre},
                 {"texts", texts()}});
    expect_same_as_ref(*t, ref, std::string("synthetic/") + pre);
  }
}

// Every pre-tokenizer, also those without a reference here, round-trips any UTF-8 text; a byte
// that is not UTF-8 comes back as U+FFFD, as llama.cpp reads it.
TEST(Tokenizer, AllPreTokenizersRoundTrip) {
  std::vector<std::string> all = texts();
  all.push_back("bad \xFF\xFE utf8 \xC3 cut \xE2\x82 end\x80");
  std::string bytes;
  for (int b = 0; b < 256; ++b) bytes += static_cast<char>(b);
  all.push_back(bytes);
  for (const char* pre : {"gpt2", "smollm", "llama3", "llama-bpe", "qwen2", "default"}) {
    const auto t = tok::make_tokenizer(synthetic_data(600, pre));
    for (const std::string& x : all)
      EXPECT_EQ(t->decode(t->encode(x, false, false)), tok::replace_invalid_utf8(x))
          << pre << ": " << x.substr(0, 40);
  }
}

TEST(Tokenizer, SyntheticThroughGguf) {
  const SyntheticVocab s = make_synthetic_vocab(1024);
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::str("llama"));
  w.set("tokenizer.ggml.model", gguf::Value::str(s.model));
  w.set("tokenizer.ggml.pre", gguf::Value::str(s.pre));
  gguf::Array toks, types, merges;
  for (const auto& x : s.tokens) toks.push_back(gguf::Value::str(x));
  for (int32_t x : s.types) types.push_back(gguf::Value::i32(x));
  for (const auto& x : s.merges) merges.push_back(gguf::Value::str(x));
  w.set("tokenizer.ggml.tokens", gguf::Value::array(gguf::ValueType::STRING, toks));
  w.set("tokenizer.ggml.token_type", gguf::Value::array(gguf::ValueType::I32, types));
  w.set("tokenizer.ggml.merges", gguf::Value::array(gguf::ValueType::STRING, merges));
  w.set("tokenizer.ggml.bos_token_id", gguf::Value::u32(static_cast<uint32_t>(s.bos)));
  w.set("tokenizer.ggml.eos_token_id", gguf::Value::u32(static_cast<uint32_t>(s.eos)));
  w.set("tokenizer.chat_template", gguf::Value::str(s.chat_template));
  const auto f = gguf::File::from_buffer(w.to_bytes(), "synthetic.gguf");
  const auto t = Tokenizer::from_gguf(*f);
  EXPECT_EQ(t->n_vocab(), 1024);
  EXPECT_EQ(t->chat_family(), "chatml");
  EXPECT_TRUE(t->is_eog(t->find("<|im_end|>")));
  EXPECT_TRUE(t->is_eog(s.eos));
  EXPECT_FALSE(t->add_bos());

  if (python().empty()) return;
  char path[] = "/tmp/kvs_synth_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  w.write(path);
  const json ref = run_ref({{"gguf", path}, {"texts", texts()}});
  std::remove(path);
  expect_same_as_ref(*t, ref, "synthetic gguf");
}

TEST(Tokenizer, SmolLM2MatchesHuggingFace) {
  const std::string path = smollm_path();
  if (path.empty()) GTEST_SKIP() << "SmolLM2 model not in KVS_MODEL_DIR";
  if (python().empty()) GTEST_SKIP() << "no KVS_PYTHON";
  const auto f = gguf::File::open(path);
  const auto t = Tokenizer::from_gguf(*f);
  EXPECT_EQ(t->n_vocab(), 49152);
  EXPECT_EQ(t->chat_family(), "chatml");
  EXPECT_EQ(t->bos(), 1);
  EXPECT_EQ(t->eos(), 2);
  EXPECT_TRUE(t->is_eog(t->find("<|im_end|>")));
  EXPECT_TRUE(t->is_eog(t->find("<|endoftext|>")));
  EXPECT_FALSE(t->is_eog(t->find("Hello")));
  const json ref = run_ref({{"gguf", path}, {"texts", texts()}});
  expect_same_as_ref(*t, ref, "SmolLM2");

  // Speed on the long text (informational).
  const std::string text = long_text() + long_text() + long_text() + long_text();
  const auto t0 = std::chrono::steady_clock::now();
  size_t n = 0;
  for (int i = 0; i < 5; ++i) n += t->encode(text, false, false).size();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("encode: %zu tokens in %.3f s = %.0f tokens/s (%.1f MB/s)\n", n, s,
              static_cast<double>(n) / s, 5.0 * static_cast<double>(text.size()) / s / 1e6);
}

// Texts for Gemma 3's vocab besides texts(): its control and user-defined pieces (turn markers,
// runs of newlines, spaces and tabs, HTML tags), characters only byte pieces cover, and text
// that spells a byte piece.
std::vector<std::string> gemma3_texts() {
  std::vector<std::string> t = texts();
  const std::vector<std::string> more = {
      "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n4<end_of_turn>\n",
      "<bos>text<eos><pad><mask><unk>",
      "a  b\t\tc\n\n\nd    e" + std::string(40, '\n') + "f" + std::string(35, ' ') + "g" +
          std::string(33, '\t'),
      "<table><tr><td>1</td></tr></table> <h1>Title</h1> <b>bold</b><i>it</i>",
      "\xEE\x80\x80 \xCD\xB8 \xF0\xA0\x80\x80 \xF0\x9D\x94\x98\xF0\x9D\x94\xAB \xF0\x9F\xAB\xA8 "
      "\xEA\x99\xAE",
      "<unused5> [multimodal] <start_of_image><end_of_image>",
      "  two spaces first, two after  ",
      "Ünïcödé — “quotes” ‘single’ … ½ ∑ ∞ → ✓",
      "the bytes <0x41><0xFF> spelled out",
      "\n",
      "\r\n\r\n windows\r\n",
  };
  t.insert(t.end(), more.begin(), more.end());
  return t;
}

// Gemma 3's SentencePiece vocab (no space prefix, BOS added, turn markers as control pieces)
// against tools/reference.py's tokenizer, which follows llama.cpp's llm_tokenizer_spm.
TEST(Tokenizer, Gemma3MatchesReference) {
  const std::string path = gemma3_path();
  if (path.empty()) GTEST_SKIP() << "gemma-3-270m-q4_k_m.gguf not in KVS_MODEL_DIR";
  if (python().empty()) GTEST_SKIP() << "no KVS_PYTHON";
  const auto f = gguf::File::open(path);
  const auto t = Tokenizer::from_gguf(*f);
  EXPECT_EQ(t->n_vocab(), 262144);
  EXPECT_EQ(t->bos(), 2);
  EXPECT_EQ(t->eos(), 1);
  EXPECT_TRUE(t->add_bos());
  EXPECT_TRUE(t->is_eog(1));
  EXPECT_TRUE(t->is_eog(t->find("<end_of_turn>")));
  EXPECT_FALSE(t->is_eog(t->find("<start_of_turn>")));
  EXPECT_EQ(t->encode("Hello world", true, false),
            (std::vector<int32_t>{2, t->find("Hello"), t->find("\xE2\x96\x81world")}));
  EXPECT_EQ(t->decode(t->encode("Hello world", true, true)), "Hello world");
  // The file has no chat template (a base model): none is guessed from its turn pieces.
  EXPECT_EQ(t->chat_family(), "none");
  EXPECT_FALSE(t->has_chat_template());
  EXPECT_EQ(t->apply_chat({{"system", "Be brief."}, {"user", "Hi!"}}), "Be brief.Hi!");
  // Turn pieces written in the text are still single tokens.
  const std::string conv =
      "<start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n<start_of_turn>model\n";
  const auto conv_ids = t->encode(conv, true, true);
  EXPECT_EQ(conv_ids.front(), 2);
  EXPECT_EQ(conv_ids[1], t->find("<start_of_turn>"));
  EXPECT_EQ(std::count(conv_ids.begin(), conv_ids.end(), 2), 1);

  const std::vector<std::string> all = gemma3_texts();
  const json ref = run_ref({{"gguf", path}, {"spm", true}, {"texts", all}});
  ASSERT_TRUE(ref.contains("ids"));
  ASSERT_EQ(ref["ids"].size(), all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    const auto ids = t->encode(all[i], false, true);
    EXPECT_EQ(ids, ref["ids"][i].get<std::vector<int32_t>>())
        << "text " << i << ": " << all[i].substr(0, 80);
    EXPECT_EQ(t->decode(ids, true), all[i]) << "text " << i;
  }
}

// Bytes that are not UTF-8 become U+FFFD, one a byte, before byte-level BPE, as llama.cpp reads
// them (ids from stock llama.cpp's llama_tokenize on this file); never the unknown token.
TEST(Tokenizer, InvalidUtf8AsLlamaCpp) {
  const std::string path = smollm_path();
  if (path.empty()) GTEST_SKIP() << "SmolLM2 model not in KVS_MODEL_DIR";
  const auto f = gguf::File::open(path);
  const auto t = Tokenizer::from_gguf(*f);
  EXPECT_EQ(t->encode("\xff\xfe\xc3(\xe2\x82 tab", false, false),
            (std::vector<int32_t>{24211, 24211, 24211, 24, 24211, 24211, 10147}));
  EXPECT_EQ(tok::replace_invalid_utf8("a\xc3\xa9\xe2\x82"), "a\xc3\xa9\xef\xbf\xbd\xef\xbf\xbd");
  // SmolLM2's vocab has no token for the byte 0x04: dropped, not its unknown token (id 0, which
  // is <|endoftext|>).
  EXPECT_EQ(t->encode("l\x01\x04" "d!", false, false), (std::vector<int32_t>{92, 191, 84, 17}));
}

TEST(Tokenizer, SpecialTokensOnlyWhenAsked) {
  const auto t = tok::make_tokenizer(synthetic_data(1000, "gpt2"));
  const int32_t start = t->find("<|im_start|>"), end = t->find("<|im_end|>");
  ASSERT_GE(start, 0);
  const auto with = t->encode("<|im_start|>user\nhi<|im_end|>", false, true);
  ASSERT_GE(with.size(), 3u);
  EXPECT_EQ(with.front(), start);
  EXPECT_EQ(with.back(), end);
  const auto without = t->encode("<|im_start|>user\nhi<|im_end|>", false, false);
  for (int32_t id : without) EXPECT_NE(t->token_text(id).substr(0, 2), "<|");
  EXPECT_EQ(t->decode(without), "<|im_start|>user\nhi<|im_end|>");
  // Control tokens print only with `special`.
  EXPECT_EQ(t->decode(with), "user\nhi");
  EXPECT_EQ(t->decode(with, true), "<|im_start|>user\nhi<|im_end|>");
  EXPECT_TRUE(t->encode("", true, true).empty());  // no BOS for GPT-2 style vocabs
}

TEST(Tokenizer, StreamDecoderHoldsSplitCharacters) {
  const auto t = tok::make_tokenizer(synthetic_data(1000, "gpt2"));
  // "é" and "🚀" are not merged in the synthetic vocab, so their bytes are separate tokens.
  const std::string text = "caf\xC3\xA9 \xF0\x9F\x9A\x80!";
  const auto ids = t->encode(text, false, false);
  StreamDecoder d(*t);
  std::string out;
  for (int32_t id : ids) {
    const std::string piece = d.push(id);
    // Never a partial character: every piece is valid UTF-8 on its own.
    for (size_t i = 0; i < piece.size();) {
      const size_t n = tok::utf8_char_len(piece, i);
      ASSERT_GT(n, 0u) << "partial character after token " << id;
      i += n;
    }
    out += piece;
  }
  out += d.flush();
  EXPECT_EQ(out, text);

  // A character cut off at the end comes out as U+FFFD on flush.
  StreamDecoder d2(*t);
  const int32_t lead = t->find("\xC3\x83");  // byte 0xC3 in the GPT-2 mapping is "Ã"
  ASSERT_GE(lead, 0);
  EXPECT_EQ(d2.push(t->find("a")), "a");
  EXPECT_EQ(d2.push(lead), "");
  EXPECT_EQ(d2.flush(), "\xEF\xBF\xBD");
}

// A tiny Llama-2 style vocab: <unk>, <s>, </s>, 256 byte tokens, then scored pieces.
tok::VocabData spm_vocab() {
  tok::VocabData v;
  v.model = "llama";
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.types = {tok::kUnknown, tok::kControl, tok::kControl};
  v.scores = {0, 0, 0};
  char hex[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    v.tokens.push_back(hex);
    v.types.push_back(tok::kByte);
    v.scores.push_back(0);
  }
  const std::vector<std::pair<std::string, float>> pieces = {
      {"\xE2\x96\x81", -1},
      {"h", -2},
      {"e", -2},
      {"l", -2},
      {"o", -2},
      {"w", -2},
      {"r", -2},
      {"d", -2},
      {"\xE2\x96\x81h", -3},
      {"ll", -3},
      {"\xE2\x96\x81he", -4},
      {"llo", -5},
      {"\xE2\x96\x81hello", -6},
      {"\xE2\x96\x81w", -4},
      {"or", -4},
      {"\xE2\x96\x81wor", -5},
      {"ld", -5},
      {"\xE2\x96\x81world", -7},
      {"he", -3.5f},
      {"lo", -4.5f},
  };
  for (const auto& [p, s] : pieces) {
    v.tokens.push_back(p);
    v.types.push_back(tok::kNormal);
    v.scores.push_back(s);
  }
  v.bos = 1;
  v.eos = 2;
  v.unk = 0;
  v.chat_template = "{% if messages[0]['role'] == 'system' %}[INST] <<SYS>>...";
  return v;
}

TEST(Tokenizer, SentencePieceSegmentations) {
  const auto t = tok::make_tokenizer(spm_vocab());
  const auto id = [&](const char* s) { return t->find(s); };
  EXPECT_TRUE(t->add_bos());
  EXPECT_EQ(t->chat_family(), "llama2");
  EXPECT_EQ(t->encode("hello world", true, false),
            (std::vector<int32_t>{1, id("\xE2\x96\x81hello"), id("\xE2\x96\x81world")}));
  // Inside a word there is no "▁hello": ll (-3) merges first, then he (-3.5), then llo (-5);
  // "x" has no piece and falls back to its byte.
  EXPECT_EQ(t->encode("xhello", false, false),
            (std::vector<int32_t>{id("\xE2\x96\x81"), id("<0x78>"), id("he"), id("llo")}));
  // Characters no piece covers become their UTF-8 bytes.
  EXPECT_EQ(t->encode("h\xC3\xA9", false, false),
            (std::vector<int32_t>{id("\xE2\x96\x81h"), id("<0xC3>"), id("<0xA9>")}));
  EXPECT_TRUE(t->encode("", false, false).empty());
  EXPECT_EQ(t->encode("", true, false), (std::vector<int32_t>{1}));
  // Control text only parsed on request.
  EXPECT_EQ(t->encode("</s>", false, true), (std::vector<int32_t>{2}));
  EXPECT_NE(t->encode("</s>", false, false), (std::vector<int32_t>{2}));
  EXPECT_TRUE(t->is_eog(2));
  EXPECT_FALSE(t->is_eog(1));

  for (const std::string& s : texts()) {
    EXPECT_EQ(t->decode(t->encode(s, true, false)), s) << s.substr(0, 60);
  }
  EXPECT_EQ(t->decode(t->encode("hello world", true, false), true), "<s>hello world");
}

TEST(Tokenizer, ChatTemplates) {
  tok::VocabData v = synthetic_data(1000, "gpt2");
  const std::vector<ChatMessage> msgs = {{"system", "Be brief."}, {"user", "Hi!"}};
  {
    const auto t = tok::make_tokenizer(v);
    ASSERT_EQ(t->chat_family(), "chatml");
    EXPECT_EQ(t->apply_chat_family(msgs),
              "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
              "<|im_start|>assistant\n");
    const auto ids = t->encode(t->apply_chat_family(msgs), true, true);
    EXPECT_EQ(ids.front(), t->find("<|im_start|>"));
  }
  v.chat_template = "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>' }}";
  EXPECT_EQ(tok::make_tokenizer(v)->apply_chat_family(msgs),
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  v.chat_template = "{{ '[INST] ' + message['content'] + ' [/INST]' }}";
  EXPECT_EQ(tok::make_tokenizer(v)->apply_chat_family(
                {{"system", "S"}, {"user", "U1"}, {"assistant", "A1"}, {"user", "U2"}}),
            "[INST] <<SYS>>\nS\n<</SYS>>\n\nU1 [/INST] A1 </s><s>[INST] U2 [/INST]");
  // Gemma's: the system prompt opens the first user turn, the assistant is "model", contents
  // are trimmed, and the model's turn is left open.
  v.chat_template = "{{ '<start_of_turn>' + role + '\\n' }}";
  EXPECT_EQ(tok::make_tokenizer(v)->chat_family(), "gemma");
  EXPECT_EQ(tok::make_tokenizer(v)->apply_chat_family({{"system", " Be brief.\n"},
                                                {"user", "Hi!"},
                                                {"assistant", "Hello.\n"},
                                                {"user", " Bye "}}),
            "<start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n"
            "<start_of_turn>model\nHello.<end_of_turn>\n"
            "<start_of_turn>user\nBye<end_of_turn>\n"
            "<start_of_turn>model\n");
  EXPECT_EQ(tok::make_tokenizer(v)->apply_chat_family({{"user", "Hi!"}}),
            "<start_of_turn>user\nHi!<end_of_turn>\n<start_of_turn>model\n");
  // Without a template, or with one of another family: the texts as they are, a completion.
  for (const char* tmpl : {"", "{{ '<|user|>' + message['content'] + '<|end|>' }}"}) {
    v.chat_template = tmpl;
    const auto t = tok::make_tokenizer(v);
    EXPECT_EQ(t->chat_family(), "none") << tmpl;
    EXPECT_EQ(t->has_chat_template(), *tmpl != 0) << tmpl;
    EXPECT_EQ(t->apply_chat_family(msgs), "Be brief.Hi!") << tmpl;
    EXPECT_EQ(t->apply_chat_family({{"user", "The capital of France is"}}), "The capital of France is");
  }
}

// A vocab with Gemma's turn pieces and no template (Gemma's base models) gets no guessed
// template: a chat is a plain completion; <end_of_turn> still ends generation.
TEST(Tokenizer, GemmaTurnsWithoutTemplate) {
  tok::VocabData v = spm_vocab();
  v.chat_template.clear();
  v.add_space_prefix = false;
  for (const char* t : {"<start_of_turn>", "<end_of_turn>"}) {
    v.tokens.push_back(t);
    v.types.push_back(tok::kControl);
    v.scores.push_back(0);
  }
  const auto t = tok::make_tokenizer(v);
  EXPECT_EQ(t->chat_family(), "none");
  EXPECT_FALSE(t->has_chat_template());
  const int32_t start = t->find("<start_of_turn>"), end = t->find("<end_of_turn>");
  EXPECT_TRUE(t->is_eog(end));
  EXPECT_FALSE(t->is_eog(start));
  EXPECT_EQ(t->encode(t->apply_chat({{"user", "hello"}}), true, true),
            t->encode("hello", true, false));
  // With Gemma's template, its format.
  v.chat_template = "{{ '<start_of_turn>' + role + '\\n' }}";
  const auto g = tok::make_tokenizer(v);
  EXPECT_EQ(g->chat_family(), "gemma");
  const auto ids = g->encode(g->apply_chat_family({{"user", "hello"}}), true, true);
  // BOS once, then the turn markers as single tokens; no space prefix before "hello".
  EXPECT_EQ(ids,
            (std::vector<int32_t>{1, start, g->find("<0x75>"), g->find("<0x73>"), g->find("e"),
                                  g->find("r"), g->find("<0x0A>"), g->find("he"), g->find("llo"),
                                  end, g->find("<0x0A>"), start, g->find("<0x6D>"), g->find("o"),
                                  g->find("d"), g->find("e"), g->find("l"), g->find("<0x0A>")}));
}

// The bound on the bytes one token stands for: the longest vocab text, at least 4.
TEST(Tokenizer, MaxTokenBytes) {
  tok::VocabData v = spm_vocab();
  size_t longest = 0;
  for (const std::string& t : v.tokens) longest = std::max(longest, t.size());
  EXPECT_EQ(tok::make_tokenizer(v)->max_token_bytes(), std::max<size_t>(longest, 4));
  v.tokens.push_back(std::string(100, 'a'));
  v.types.push_back(tok::kNormal);
  v.scores.push_back(0);
  EXPECT_EQ(tok::make_tokenizer(v)->max_token_bytes(), 100u);
}

TEST(Tokenizer, RejectsUnknownModelAndPre) {
  tok::VocabData v = synthetic_data(300, "gpt2");
  v.model = "wordpiece";
  try {
    tok::make_tokenizer(v);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("wordpiece"), std::string::npos) << e.what();
  }
  v.model = "gpt2";
  v.pre = "mystery-pre";
  try {
    tok::make_tokenizer(v);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mystery-pre"), std::string::npos) << e.what();
  }
  const auto t = tok::make_tokenizer(synthetic_data(300, "default"));
  EXPECT_THROW(t->token_to_piece(300, false), Error);
  EXPECT_EQ(t->find("no such token"), -1);
}

}  // namespace
}  // namespace kvs
