// n > 1: n sequences of the same prompt, each with its own seed (the request's seed plus the
// choice's index, or random), answered together as n choices, whole or streamed (each chunk
// one choice's, by its index); the prompt is read once, its pages shared through the prompt
// cache.
#include <ctime>
#include <memory>
#include <optional>

#include "kvs/chat/chat_parse.h"
#include "serve.h"

namespace kvs::cli {

void Api::choices(httplib::Response& res, const GenRequest& r, int64_t n, bool chat, bool stream,
                  bool include_usage) {
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
    std::unique_ptr<ChatStream> parse;  // a chat stream's parser (reasoning, tool calls)
    bool started = false;               // a chat stream's first delta (the role) is sent
  };
  auto st = std::make_shared<std::vector<State>>(static_cast<size_t>(n));
  const std::string id = cat(chat ? "chatcmpl-" : "cmpl-", random_id());
  const std::time_t created = std::time(nullptr);
  const char* object =
      chat ? (stream ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  auto envelope = [=, this](json list) {
    return json{{"id", id},
                {"object", object},
                {"created", created},
                {"model", model_id},
                {"system_fingerprint", fingerprint()},
                {"choices", std::move(list)}};
  };
  // A stream's chunk of choice k: a chat delta or a completion's text.
  auto chunk = [=](size_t k, json delta_or_text, json finish) {
    json c = {{"index", k}, {"logprobs", nullptr}, {"finish_reason", std::move(finish)}};
    c[chat ? "delta" : "text"] = std::move(delta_or_text);
    return envelope(json::array({std::move(c)}));
  };
  auto provider = [=, this](size_t, httplib::DataSink& sink) {
    auto cancel = [&] {
      for (const auto& j : *jobs) j->cancelled = true;
      return false;
    };
    if (!sink.is_writable()) return cancel();
    bool all = true;
    std::string error, out;
    auto sse = [&](const json& j) { out += "data: " + dump(j) + "\n\n"; };
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
      if (stream && chat && !s.started) {
        s.started = true;
        if (r.chat.enabled) s.parse = std::make_unique<ChatStream>(r.chat);
        sse(chunk(k, {{"role", "assistant"}, {"content", nullptr}}, nullptr));
      }
      std::vector<Event> events;
      (*jobs)[k]->pop(events, 0.1 / static_cast<double>(jobs->size()));
      for (Event& e : events) {
        if (!e.error.empty()) error = e.error;
        s.text += e.text;
        if (stream && !e.text.empty()) {
          if (s.parse)
            for (const auto& d : s.parse->push(e.text)) sse(chunk(k, json::parse(d.dump()), nullptr));
          else
            sse(chunk(k, chat ? json{{"content", e.text}} : json(e.text), nullptr));
        }
        if (e.done) {
          count_end(e);
          if (stream) {
            std::string finish = e.finish_reason;
            if (s.parse) {
              for (const auto& d : s.parse->finish()) sse(chunk(k, json::parse(d.dump()), nullptr));
              if (s.parse->has_tool_calls() && finish == "stop") finish = "tool_calls";
            }
            sse(chunk(k, chat ? json::object() : json(""), finish));
          }
          s.end = std::move(e);
          break;
        }
      }
      all &= s.end.has_value();
    }
    all &= jobs->size() == static_cast<size_t>(n);
    const bool failed = !error.empty();
    if (failed) {
      for (const auto& j : *jobs) j->cancelled = true;
      const json err = error_body(ApiError{500, error, "server_error"});
      if (stream)
        sse(err);
      else
        out = dump(err);
    } else if (all) {
      json list = json::array();
      int64_t completion = 0;
      for (size_t k = 0; k < jobs->size(); ++k) {
        const State& s = (*st)[k];
        completion += s.end->completion_tokens;
        if (stream) continue;
        std::string finish = s.end->finish_reason;
        if (!chat) {
          list.push_back({{"index", k}, {"text", s.text}, {"logprobs", nullptr},
                          {"finish_reason", finish}});
          continue;
        }
        json message = {{"role", "assistant"}, {"content", s.text}};
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
      const json u = {{"prompt_tokens", first.prompt_tokens},
                      {"completion_tokens", completion},
                      {"total_tokens", first.prompt_tokens + completion}};
      if (stream) {
        if (include_usage) {
          json last = envelope(json::array());
          last["usage"] = u;
          sse(last);
        }
        out += "data: [DONE]\n\n";
      } else {
        json j = envelope(std::move(list));
        j["usage"] = u;
        out = dump(j);
      }
    }
    if (!out.empty() && !sink.write(out.data(), out.size())) return cancel();
    if (failed || all) sink.done();
    return true;
  };
  auto release = [jobs](bool ok) {
    if (!ok)
      for (const auto& j : *jobs) j->cancelled = true;
  };
  res.set_chunked_content_provider(stream ? "text/event-stream" : "application/json", provider,
                                   release);
}

}  // namespace kvs::cli
