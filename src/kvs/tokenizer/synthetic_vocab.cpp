// make_synthetic_vocab: a byte-level BPE vocabulary of any size for synthetic models. Merges
// come from BPE training on a short built-in English text; once its pairs run out, the vocab is
// filled with systematic "token + letter" merges, so any size works and every merge's result is
// a token.
#include <algorithm>
#include <map>
#include <unordered_map>

#include "kvs/tokenizer/bpe.h"
#include "kvs/util/error.h"

namespace kvs {
namespace {

const char* const kText =
    "The quick brown fox jumps over the lazy dog. A small model reads a long text, one token at "
    "a time, and writes the next word it thinks will come. It is not magic: it is a table of "
    "numbers, learned from many pages of books, letters, code and talk.\n\n"
    "When you ask a question, the model looks at every word you wrote and at every word it has "
    "written so far. Then it picks what should follow. If the answer is long, the memory it "
    "keeps for each word grows too, and that memory has to live somewhere: in the fast memory "
    "of the graphics card while it fits, and in the slower memory of the computer when it does "
    "not.\n\n"
    "Here is a simple program that counts to ten:\n"
    "def count(n):\n    for i in range(1, n + 1):\n        print(i)\n\ncount(10)\n\n"
    "And the same in C++:\n"
    "int main() {\n  for (int i = 1; i <= 10; ++i) std::printf(\"%d\\n\", i);\n  return 0;\n}\n\n"
    "People have written stories for thousands of years. They wrote about the sea and the "
    "mountains, about kings and farmers, about love, war, hunger and hope. Some of these stories "
    "were told again and again until everyone knew them by heart. Others were lost, and we only "
    "know that they once existed because another writer mentioned them.\n\n"
    "The weather today is cold and grey, with rain in the morning and wind in the afternoon. "
    "Tomorrow should be warmer: the sun will be out, the temperature will reach 18 degrees, and "
    "the evening will be clear. It's a good day for a walk in the park, or for reading a book "
    "by the window while the kettle boils.\n\n"
    "Questions and answers:\n"
    "Q: What is the capital of France?\nA: The capital of France is Paris.\n"
    "Q: How many days are there in a week?\nA: There are seven days in a week.\n"
    "Q: What do plants need to grow?\nA: Plants need light, water, air and good soil.\n"
    "Q: Why is the sky blue?\nA: Because air scatters blue light more than red light.\n";

}  // namespace

SyntheticVocab make_synthetic_vocab(int32_t n_vocab) {
  KVS_CHECK(n_vocab >= 300, "make_synthetic_vocab: n_vocab ", n_vocab, " is below 300");
  SyntheticVocab v;
  for (const char* s : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    v.tokens.emplace_back(s);
    v.types.push_back(tok::kControl);
  }
  v.bos = v.eos = 0;  // <|endoftext|>; <|im_end|> ends chat turns by its name
  v.chat_template =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
      "{{ '<|im_start|>assistant\\n' }}{% endif %}";
  const auto& b2u = tok::byte_to_unicode();
  const auto first_byte = static_cast<int32_t>(v.tokens.size());
  for (const std::string& s : b2u) {
    v.tokens.push_back(s);
    v.types.push_back(tok::kNormal);
  }
  std::unordered_map<std::string, int32_t> have;
  for (size_t i = 0; i < v.tokens.size(); ++i) have.emplace(v.tokens[i], static_cast<int32_t>(i));

  // Training words: the text's pre-tokens as byte-token sequences, with their counts.
  std::map<std::string, int> counts;
  tok::Pretokenizer pre(
      {R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"});
  for (std::string_view w : pre.split(kText)) ++counts[std::string(w)];
  std::vector<std::pair<std::vector<int32_t>, int>> words;
  for (const auto& [w, c] : counts) {
    std::vector<int32_t> ids;
    for (char ch : w) ids.push_back(first_byte + static_cast<uint8_t>(ch));
    words.emplace_back(std::move(ids), c);
  }

  const auto add = [&](int32_t a, int32_t b) {
    const std::string joined = v.tokens[a] + v.tokens[b];
    v.merges.push_back(v.tokens[a] + " " + v.tokens[b]);
    const auto [it, fresh] = have.emplace(joined, static_cast<int32_t>(v.tokens.size()));
    if (fresh) {  // two pairs can spell the same text; the token exists once
      v.tokens.push_back(joined);
      v.types.push_back(tok::kNormal);
    }
    return it->second;
  };

  // BPE training: merge the most frequent adjacent pair (ties: lowest ids) until none is left.
  while (static_cast<int32_t>(v.tokens.size()) < n_vocab) {
    std::unordered_map<uint64_t, int> pairs;
    for (const auto& [ids, c] : words)
      for (size_t i = 0; i + 1 < ids.size(); ++i)
        pairs[(static_cast<uint64_t>(ids[i]) << 32) | static_cast<uint32_t>(ids[i + 1])] += c;
    if (pairs.empty()) break;
    uint64_t best = 0;
    int best_count = 0;
    for (const auto& [k, c] : pairs)
      if (c > best_count || (c == best_count && k < best)) best = k, best_count = c;
    const auto a = static_cast<int32_t>(best >> 32), b = static_cast<int32_t>(best & 0xFFFFFFFF);
    const int32_t ab = add(a, b);
    for (auto& [ids, c] : words) {
      std::vector<int32_t> merged;
      for (size_t i = 0; i < ids.size(); ++i) {
        if (i + 1 < ids.size() && ids[i] == a && ids[i + 1] == b) {
          merged.push_back(ab);
          ++i;
        } else {
          merged.push_back(ids[i]);
        }
      }
      ids.swap(merged);
    }
  }

  // Fill up: every token so far, in id order, extended by each lowercase letter.
  for (size_t t = static_cast<size_t>(first_byte); static_cast<int32_t>(v.tokens.size()) < n_vocab;
       ++t) {
    for (char c = 'a'; c <= 'z' && static_cast<int32_t>(v.tokens.size()) < n_vocab; ++c) {
      const int32_t letter = first_byte + static_cast<uint8_t>(c);
      if (have.count(v.tokens[t] + v.tokens[letter])) continue;  // already spelled
      add(static_cast<int32_t>(t), letter);
    }
  }
  return v;
}

}  // namespace kvs
