// kvstream chat (and run -cnv): an interactive conversation that keeps its KV cache between
// turns, so a turn evaluates only the tokens its message adds to the templated conversation.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "kvs/engine/engine.h"
#include "kvs/engine/generate.h"
#include "kvs/engine/sampler.h"
#include "kvs/model/model.h"
#include "kvs/util/error.h"
#include "kvs/util/parse.h"
#include "kvs/util/threadpool.h"

namespace kvs::cli {
namespace {

// Lines of stdin through read(2), so that a Ctrl-C while waiting at the prompt returns at once.
class LineReader {
 public:
  enum Result { kLine, kEof, kInterrupt };
  Result next(std::string& line) {
    for (;;) {
      const size_t nl = buf_.find('\n');
      if (nl != std::string::npos || (eof_ && !buf_.empty())) {
        const size_t end = nl == std::string::npos ? buf_.size() : nl;
        line = buf_.substr(0, end);
        buf_.erase(0, nl == std::string::npos ? end : end + 1);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        return kLine;
      }
      if (eof_) return kEof;
      char b[4096];
      const ssize_t n = ::read(STDIN_FILENO, b, sizeof b);
      if (n < 0 && errno == EINTR) {
        if (!interrupted()) continue;
        clear_interrupt();
        buf_.clear();  // the terminal dropped the line being typed too
        return kInterrupt;
      }
      KVS_CHECK(n >= 0, "reading stdin: ", std::strerror(errno));
      if (n == 0)
        eof_ = true;
      else
        buf_.append(b, static_cast<size_t>(n));
    }
  }

 private:
  std::string buf_;
  bool eof_ = false;
};

struct TurnStats {
  int64_t prompt_tokens = 0, reused_tokens = 0, answer_tokens = 0;
  int64_t drafted = 0, accepted = 0;  // speculative decoding's draft tokens
  double prompt_s = 0, answer_s = 0;
  size_t bytes_streamed = 0;
};

class Chat {
 public:
  Chat(const SharedArgs& s, const GenArgs& g, Speculator& spec, const Model& model, Engine& eng)
      : s_(s),
        g_(g),
        spec_(spec),
        model_(model),
        tok_(*model.tokenizer),
        eng_(eng),
        n_predict_(n_predict_of(g)),
        sampler_(params(g)) {
    clear();
  }

  // One user message: its tokens into the KV, then the answer, streamed to stdout.
  void turn(const std::string& text) {
    std::vector<ChatMessage> next = msgs_;
    next.push_back({"user", text});
    const std::vector<int32_t> target = tok_.encode(tok_.apply_chat(next), true, true);
    const int32_t n_ctx = eng_.options().n_ctx;
    if (static_cast<int64_t>(target.size()) >= n_ctx) {
      std::fprintf(stderr,
                   "kvstream: this message makes the conversation %s, more than the context "
                   "holds (-c %d, %s used); /clear starts a new conversation\n",
                   count_of(static_cast<int64_t>(target.size()), "token").c_str(), n_ctx,
                   count_of(static_cast<int64_t>(kv_.size()), "token").c_str());
      return;
    }
    // The KV holds the conversation so far exactly when its tokens begin the new prompt; else
    // (a reply that re-tokenizes differently, a cut turn) the conversation is evaluated anew.
    const bool keep =
        kv_.size() <= target.size() && std::equal(kv_.begin(), kv_.end(), target.begin());
    if (!keep) reset_kv();
    TurnStats st;
    st.reused_tokens = static_cast<int64_t>(kv_.size());
    const EngineStats before = eng_.totals();
    const int32_t b = eng_.options().n_batch;
    const int64_t n_new = static_cast<int64_t>(target.size() - kv_.size());
    Progress progress("prompt", n_new, n_new > 2 * int64_t{b});
    const double t0 = now();
    const size_t from = kv_.size();
    const float* logits = nullptr;
    while (kv_.size() < target.size() && !interrupted()) {
      const size_t at = kv_.size();
      const int32_t m =
          static_cast<int32_t>(std::min<size_t>(static_cast<size_t>(b), target.size() - at));
      logits = eng_.eval(seq_, target.data() + at, m);
      kv_.insert(kv_.end(), target.begin() + static_cast<long>(at),
                 target.begin() + static_cast<long>(at) + m);
      for (int32_t i = 0; i < m; ++i) sampler_.accept(target[at + static_cast<size_t>(i)]);
      progress.update(static_cast<int64_t>(kv_.size() - from));
    }
    progress.finish();
    st.prompt_tokens = n_new;
    st.prompt_s = now() - t0;
    if (interrupted()) {
      clear_interrupt();
      std::fprintf(stderr, "kvstream: stopped (Ctrl-C) while reading the message\n");
      return;
    }

    StreamDecoder dec(tok_);
    std::string reply;
    bool full = false;
    const double t1 = now();
    if (n_predict_ != 0 && !interrupted()) answer(target, logits, dec, reply, st, full);
    emit(dec.flush(), reply);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    st.answer_s = now() - t1;
    st.bytes_streamed = eng_.totals().bytes_in - before.bytes_in;
    if (interrupted()) {
      clear_interrupt();
      std::fprintf(stderr, "kvstream: answer stopped (Ctrl-C)\n");
    }
    if (full)
      std::fprintf(stderr,
                   "kvstream: the context is full (-c %d); /clear starts a new conversation\n",
                   n_ctx);
    msgs_ = std::move(next);
    msgs_.push_back({"assistant", reply});
    last_ = st;
    turns_.push_back(st);
  }

  // A new conversation: the KV dropped, the sampler restarted from its seed.
  void clear() {
    msgs_.clear();
    if (!g_.system.empty()) msgs_.push_back({"system", g_.system});
    reset_kv();
    sampler_.reset();
  }

  void stats() const {
    const auto& t = last_;
    std::printf(
        "context: %s of -c %d used | last answer: %s in %.2f s, %.1f tok/s (prompt %s, "
        "%.1f tok/s, %s reused) | streamed: %s this answer, %s in all%s\n",
        count_of(static_cast<int64_t>(kv_.size()), "token").c_str(), eng_.options().n_ctx,
        count_of(t.answer_tokens, "token").c_str(), t.answer_s,
        t.answer_s > 0 ? static_cast<double>(t.answer_tokens) / t.answer_s : 0.0,
        count_of(t.prompt_tokens, "token").c_str(),
        t.prompt_s > 0 ? static_cast<double>(t.prompt_tokens) / t.prompt_s : 0.0,
        count_of(t.reused_tokens, "token").c_str(), format_bytes(t.bytes_streamed).c_str(),
        format_bytes(eng_.totals().bytes_in).c_str(),
        spec_.on() ? cat(" | drafts: ", t.accepted, " of ", t.drafted, " accepted").c_str() : "");
    std::fflush(stdout);
  }

  uint64_t seed() const { return sampler_.seed(); }

  // /save NAME: the conversation's KV as a slot file (NAME.kvslot, Engine::save_prefix) and its
  // messages (NAME.json); the sequence goes through the prompt cache and comes back from it.
  void save(const std::string& name) {
    if (kv_.empty()) {
      std::fprintf(stderr, "kvstream: /save: the conversation is empty\n");
      return;
    }
    const std::vector<int32_t> tokens = kv_;
    reset_kv();  // its pages go into the prompt cache
    size_t bytes = 0;
    const int32_t n = eng_.save_prefix(tokens, name + ".kvslot", &bytes);
    resume(tokens);
    nlohmann::json j = json();
    j["kv_tokens"] = n;
    write_json(name + ".json", j);
    std::fprintf(stderr, "kvstream: saved %s of KV (%s) to %s.kvslot, the messages to %s.json\n",
                 count_of(n, "token").c_str(), format_bytes(bytes).c_str(), name.c_str(),
                 name.c_str());
  }

  // /load NAME: the messages of NAME.json and the KV of NAME.kvslot, so that the next message
  // reads only its own tokens.
  void load(const std::string& name) {
    std::ifstream in(name + ".json");
    KVS_CHECK(in.good(), "/load: cannot read '", name, ".json'");
    nlohmann::json j;
    try {
      in >> j;
    } catch (const nlohmann::json::exception& e) {
      fail("/load: '", name, ".json' is not JSON: ", e.what());
    }
    KVS_CHECK(j.contains("messages") && j["messages"].is_array(), "/load: '", name,
              ".json' has no messages");
    std::vector<ChatMessage> msgs;
    for (const auto& m : j["messages"]) {
      KVS_CHECK(m.is_object() && m.value("role", "") != "" && m.contains("content") &&
                    m["content"].is_string(),
                "/load: '", name, ".json' has a message without a role or text");
      msgs.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    std::vector<int32_t> tokens;
    size_t bytes = 0;
    eng_.load_prefix(name + ".kvslot", tokens, &bytes);
    msgs_ = std::move(msgs);
    sampler_.reset();
    reset_kv();
    resume(tokens);
    std::fprintf(stderr, "kvstream: loaded %s (%s of messages, %s of KV, %s)\n", name.c_str(),
                 count_of(static_cast<int64_t>(msgs_.size()), "message").c_str(),
                 count_of(static_cast<int64_t>(kv_.size()), "token").c_str(),
                 format_bytes(bytes).c_str());
  }

  nlohmann::json json() const {
    nlohmann::json j;
    j["model"] = s_.model;
    j["seed"] = sampler_.seed();
    nlohmann::json ms = nlohmann::json::array(), ts = nlohmann::json::array();
    for (const auto& m : msgs_) ms.push_back({{"role", m.role}, {"content", m.content}});
    for (const auto& t : turns_)
      ts.push_back({{"prompt_tokens", t.prompt_tokens},
                    {"reused_tokens", t.reused_tokens},
                    {"answer_tokens", t.answer_tokens},
                    {"prompt_s", t.prompt_s},
                    {"answer_s", t.answer_s},
                    {"drafted", t.drafted},
                    {"accepted", t.accepted},
                    {"bytes_streamed", t.bytes_streamed}});
    j["messages"] = ms;
    j["turns"] = ts;
    j["kv_tokens"] = kv_;
    return j;
  }

 private:
  // The answer to a message (`target`: the conversation up to it, in the KV; `logits`: of its
  // last token), streamed: every chosen token but the last goes into the KV, the template's
  // end of turn being part of the next prompt. With --spec a step also carries the drafts its
  // drafter proposes, the whole conversation being its history (Decoder).
  void answer(const std::vector<int32_t>& target, const float* logits, StreamDecoder& dec,
              std::string& reply, TurnStats& st, bool& full) {
    const int32_t n_ctx = eng_.options().n_ctx;
    Decoder decoder(eng_, model_.config.n_vocab, &spec_);
    Decoding d{&seq_, &sampler_};
    decoder.start(d, target.data(), static_cast<int32_t>(target.size()));
    // Shows a chosen token (`n_past` positions before it); false when the answer ends with it.
    const Decoder::Take take = [&](int32_t id, const float*, int32_t n_past, bool) {
      ++st.answer_tokens;
      kv_.push_back(id);  // until the end, which keeps those the KV holds
      if (!g_.ignore_eos && tok_.is_eog(id)) return false;
      emit(dec.push(id), reply);
      if (st.answer_tokens == n_predict_) return false;
      full = n_past >= n_ctx;
      return !full;
    };
    std::vector<BatchEntry> batch;
    for (bool more = decoder.first(d, logits, take); more && !interrupted(); more = d.next >= 0) {
      if (n_predict_ >= 0) d.max_drafts = n_predict_ - st.answer_tokens - 1;
      batch.clear();
      decoder.add_steps({&d}, batch);
      eng_.step(batch);
      decoder.advance(d, 0, take);
    }
    kv_.resize(static_cast<size_t>(seq_.n_past));
    st.drafted = d.drafted;
    st.accepted = d.accepted;
  }

  static SamplerParams params(const GenArgs& g) {
    SamplerParams sp = g.sp;
    if (g.seed >= 0) sp.seed = static_cast<uint64_t>(g.seed);
    return sp;
  }
  // A fresh sequence takes the cached pages of `tokens` (all but the last, which the next turn
  // reads again for its logits).
  void resume(const std::vector<int32_t>& tokens) {
    const int32_t n = eng_.reuse_prefix(seq_, tokens.data(), static_cast<int32_t>(tokens.size()));
    kv_.assign(tokens.begin(), tokens.begin() + n);
    for (int32_t t : kv_) sampler_.accept(t);
  }
  void reset_kv() {
    if (seq_.id >= 0) eng_.close_sequence(seq_);
    seq_ = eng_.open_sequence();
    kv_.clear();
  }
  static void emit(const std::string& piece, std::string& reply) {
    reply += piece;
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  }

  const SharedArgs& s_;
  const GenArgs& g_;
  Speculator& spec_;
  const Model& model_;
  const Tokenizer& tok_;
  Engine& eng_;
  const int64_t n_predict_;
  Sampler sampler_;
  Sequence seq_;
  std::vector<int32_t> kv_;  // the tokens in the KV, in order
  std::vector<ChatMessage> msgs_;
  TurnStats last_;
  std::vector<TurnStats> turns_;
};

struct ChatArgs {
  SharedArgs s;
  GenArgs g;
  SpecArgs spec;
  ChatTemplateArgs tmpl;
  std::string json_out;
  bool conversation = false;
};

}  // namespace

void chat_session(const SharedArgs& s, const GenArgs& g, const SpecArgs& spec,
                  const ChatTemplateArgs& tmpl, const std::string& first,
                  const std::string& json_out) {
  KVS_CHECK(s.parallel == "1", "chat: -np/--parallel is 1 (one conversation)");
  n_predict_of(g);  // a bad -n fails before the model loads
  const std::string backend = backend_of(s);
  check_flash_attn(s);
  apply_threads(s);
  const size_t vram = vram_limit_of(s);
  auto model = Model::load(s.model);
  apply_chat_template_flags(*model->tokenizer, tmpl);
  EngineOptions eo = engine_options(s, model->config);
  apply_speculation(spec, eo, backend);
  const auto draft_model = load_draft(spec, *model);
  const Tokenizer& tok = *model->tokenizer;
  note_no_template(tok, s.model, "each message continues the text, a plain completion");
  check_host_kv(eo, model->config, backend);
  auto dev = device_of(s, backend, vram);
  const auto drafter = make_drafter(spec, draft_model.get(), *model, *dev, eo);
  const auto mtp = make_mtp(spec, *model, *dev, eo);
  // A prompt cache of one conversation's KV, through which /save and /load pass.
  const KvShape kv = Engine::kv_shape(model->config, eo);
  eo.cache_ram = kv.full_bytes + kv.window_bytes + kv.recurrent_bytes;
  Engine eng(*model, *dev, eo, mtp ? &mtp->engine() : nullptr);
  Speculator speculator(spec_options(spec), eng, drafter.get(), mtp.get());
  Chat chat(s, g, speculator, *model, eng);
  const bool terminal = isatty(STDIN_FILENO) != 0;
  std::fprintf(stderr,
               "kvstream: chat with %s (%s), -c %d, %d threads, seed %llu\n"
               "kvstream: /clear starts a new conversation, /stats shows the context used and "
               "speed, /save NAME and /load NAME keep a conversation, Ctrl-C stops an answer, "
               "Ctrl-D quits\n",
               s.model.c_str(), chat_template_name(tok).c_str(), eo.n_ctx, thread_pool().size(),
               static_cast<unsigned long long>(chat.seed()));
  catch_interrupt(false);
  auto save = [&] {
    if (!json_out.empty()) write_json(json_out, chat.json());
  };
  if (!first.empty()) chat.turn(first);
  LineReader in;
  std::string line;
  for (;;) {
    if (terminal) {
      std::fputs("> ", stdout);
      std::fflush(stdout);
    }
    const LineReader::Result r = in.next(line);
    if (r == LineReader::kEof) break;
    if (r == LineReader::kInterrupt) {
      std::fputc('\n', stdout);
      continue;
    }
    if (line.empty()) continue;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/clear") {
      chat.clear();
      std::fprintf(stderr, "kvstream: new conversation\n");
    } else if (line == "/stats") {
      chat.stats();
    } else if (line.rfind("/save ", 0) == 0 || line.rfind("/load ", 0) == 0) {
      const std::string name = line.substr(6);
      try {
        if (line[1] == 's')
          chat.save(name);
        else
          chat.load(name);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "kvstream: %s\n", e.what());
      }
    } else if (line == "/help") {
      std::fprintf(stderr,
                   "kvstream: /clear: new conversation | /stats: context used, speed, bytes "
                   "streamed | /save NAME, /load NAME: the conversation and its KV to and from "
                   "NAME.json and NAME.kvslot | /exit or Ctrl-D: quit | Ctrl-C: stop an answer\n");
    } else {
      chat.turn(line);
    }
    save();
  }
  if (terminal) std::fputc('\n', stdout);
  std::fflush(stdout);
  save();
}

void register_chat(CLI::App& app) {
  auto a = std::make_shared<ChatArgs>();
  a->g.n_predict = "-1";
  CLI::App* c = app.add_subcommand(
      "chat", "Chat with a model: one message a line; the conversation's KV is kept between turns");
  add_shared(c, a->s, kModel);
  add_generation(c, a->g);
  add_speculation(c, a->spec);
  add_chat_template_flags(c, a->tmpl);
  c->add_flag("--conversation,-i,--interactive", a->conversation, "-cnv: accepted (chat is)");
  add_shared(c, a->s, kAllShared & ~kModel);
  c->add_option("--json", a->json_out,
                "Write the conversation (messages, per-turn tokens and timings) to this file");
  c->callback([a] { chat_session(a->s, a->g, a->spec, a->tmpl, "", a->json_out); });
}

}  // namespace kvs::cli
