// n > 1 on the chat endpoint: n sequences of the same prompt, each with its own seed (the
// request's seed plus the choice's index, or random), answered together as n choices; the
// prompt is read once, its pages shared through the prompt cache.
#include <memory>
#include <optional>

#include "kvs/chat/chat_parse.h"
#include "serve.h"

namespace kvs::cli {

void Api::choices(httplib::Response& res, const GenRequest& r, int64_t n) {
  // With a prompt cache the first choice reads the prompt and puts its pages there; the others
  // are queued once it has, and reuse them instead of reading it again.
  const bool share = eo.cache_ram > 0;
  auto choice = [r](int64_t i, bool first) {
    GenRequest c = r;
    if (r.sampling.seed != Sampler::kSeedRandom)
      c.sampling.seed = r.sampling.seed + static_cast<uint64_t>(i);
    c.share_prompt = first;
    return c;
  };
  auto jobs = std::make_shared<std::vector<std::shared_ptr<Job>>>();
  try {
    for (int64_t i = 0; i < (share ? 1 : n); ++i) jobs->push_back(submit(choice(i, share), res));
  } catch (...) {  // the queue filled part way: the choices already queued go
    for (const auto& j : *jobs) j->cancelled = true;
    throw;
  }
  struct State {
    std::string text;
    std::optional<Event> end;
  };
  auto st = std::make_shared<std::vector<State>>(static_cast<size_t>(n));
  const std::string id = "chatcmpl-" + random_id();
  auto provider = [=, this](size_t, httplib::DataSink& sink) {
    auto cancel = [&] {
      for (const auto& j : *jobs) j->cancelled = true;
      return false;
    };
    if (!sink.is_writable()) return cancel();
    bool all = true;
    std::string error;
    if (jobs->size() < static_cast<size_t>(n) && jobs->front()->prompt_read) {
      for (auto i = static_cast<int64_t>(jobs->size()); i < n; ++i) {
        auto job = std::make_shared<Job>(choice(i, false));
        if (!sched.submit(job)) {
          error = "every slot is busy and the queue is full; retry later";
          break;
        }
        jobs->push_back(std::move(job));
      }
    }
    for (size_t k = 0; k < jobs->size() && error.empty(); ++k) {
      State& s = (*st)[k];
      if (s.end) continue;
      std::vector<Event> events;
      (*jobs)[k]->pop(events, 0.1 / static_cast<double>(jobs->size()));
      for (Event& e : events) {
        if (!e.error.empty()) error = e.error;
        s.text += e.text;
        if (e.done) {
          count_end(e);
          s.end = std::move(e);
          break;
        }
      }
      all &= s.end.has_value();
    }
    all &= jobs->size() == static_cast<size_t>(n);
    std::string out;
    if (!error.empty()) {
      for (const auto& j : *jobs) j->cancelled = true;
      out = dump(error_body(ApiError{500, error, "server_error"}));
    } else if (all) {
      json list = json::array();
      int64_t completion = 0;
      for (size_t k = 0; k < jobs->size(); ++k) {
        const State& s = (*st)[k];
        completion += s.end->completion_tokens;
        json message = {{"role", "assistant"}, {"content", s.text}};
        std::string finish = s.end->finish_reason;
        if (r.chat.enabled) {  // reasoning and tool calls, as a single answer's
          ChatStream parse(r.chat);
          parse.push(s.text);
          parse.finish();
          message = json::parse(parse.message().dump());
          if (parse.has_tool_calls() && finish == "stop") finish = "tool_calls";
        }
        list.push_back({{"index", k},
                        {"message", std::move(message)},
                        {"logprobs", nullptr},
                        {"finish_reason", finish}});
      }
      const Event& first = *(*st)[0].end;
      out = dump({{"id", id},
                  {"object", "chat.completion"},
                  {"created", std::time(nullptr)},
                  {"model", model_id},
                  {"system_fingerprint", fingerprint()},
                  {"choices", list},
                  {"usage",
                   {{"prompt_tokens", first.prompt_tokens},
                    {"completion_tokens", completion},
                    {"total_tokens", first.prompt_tokens + completion}}}});
    }
    if (!out.empty()) {
      if (!sink.write(out.data(), out.size())) return cancel();
      sink.done();
    }
    return true;
  };
  auto release = [jobs](bool ok) {
    if (!ok)
      for (const auto& j : *jobs) j->cancelled = true;
  };
  res.set_chunked_content_provider("application/json", provider, release);
}

}  // namespace kvs::cli
