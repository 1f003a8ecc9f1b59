// Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens), which Claude-Code-
// style agents speak (its routes also take OpenAI's /v1/responses, serve_responses.cpp): the body becomes a chat request (the same template, sampling and limits
// as /v1/chat/completions), the answer Anthropic's message or its event stream. Text only:
// tool_use, tool_result and image blocks are refused with 400 naming them.
#include <memory>
#include <optional>

#include "kvs/util/error.h"
#include "serve.h"

namespace kvs::cli {
namespace {

// A system prompt or a message's content: a string or a list of text blocks, as one text.
std::string anthropic_text(const json& c, const char* field) {
  if (c.is_string()) return c.get<std::string>();
  if (c.is_null()) return "";
  if (!c.is_array()) bad(cat("'", field, "' must be a string or a list of content blocks"), field);
  std::string text;
  for (const json& block : c) {
    const std::string type = text_of(block, "type");
    if (type != "text" || !block.contains("text") || !block["text"].is_string())
      bad(cat("content blocks of type '", type,
              "' are not supported (kvstream takes text blocks: no tools or images)"),
          field);
    text += block["text"].get<std::string>();
  }
  return text;
}

// The chat completion body of an Anthropic Messages body.
json chat_body(const json& b) {
  if (!b.contains("messages") || !b["messages"].is_array())
    bad("'messages' must be a list", "messages");
  if (b.contains("tools") && b["tools"].is_array() && !b["tools"].empty())
    bad("tools are not supported", "tools");
  json msgs = json::array();
  if (b.contains("system")) {
    const std::string sys = anthropic_text(b["system"], "system");
    if (!sys.empty()) msgs.push_back({{"role", "system"}, {"content", sys}});
  }
  for (const json& m : b["messages"]) {
    const std::string role = text_of(m, "role");
    if (role != "user" && role != "assistant")
      bad(cat("message role '", role, "' is not supported (user, assistant)"), "messages");
    msgs.push_back(
        {{"role", role}, {"content", anthropic_text(m.value("content", json()), "messages")}});
  }
  // An empty conversation is one empty user turn, as llama-server accepts it.
  if (msgs.empty() || msgs.back()["role"] == "system")
    msgs.push_back({{"role", "user"}, {"content", ""}});
  json out = {{"messages", msgs}};
  for (const char* k : {"temperature", "top_p", "top_k", "max_tokens"})
    if (b.contains(k)) out[k] = b[k];
  if (b.contains("stop_sequences")) out["stop"] = b["stop_sequences"];
  return out;
}

}  // namespace

void Api::anthropic_routes(httplib::Server& svr) {
  auto guard = [](auto fn) {
    return [fn](const httplib::Request& req, httplib::Response& res) {
      try {
        fn(req, res);
      } catch (const ApiError& e) {
        send_error(res, e);
      } catch (const std::exception& e) {
        send_error(res, ApiError{500, e.what(), "server_error"});
      }
    };
  };
  svr.Post("/v1/messages/count_tokens", guard([this](const auto& req, auto& res) {
    const json b = chat_body(parse_body(req.body));
    const auto ids = tok.encode(rules.chat_text(b), true, true);
    res.set_content(dump({{"input_tokens", ids.size()}}), "application/json");
  }));
  svr.Post("/v1/messages", guard([this](const auto& req, auto& res) { messages(req, res); }));
  for (const char* path : {"/v1/responses", "/responses"})
    svr.Post(path, guard([this](const auto& req, auto& res) { responses(req, res); }));
}

void Api::messages(const httplib::Request& req, httplib::Response& res) {
  const json body = parse_body(req.body);
  const json b = chat_body(body);
  GenRequest r = rules.chat_request(b);
  try {
    Sampler check(r.sampling);
  } catch (const Error& e) {
    bad(e.what());
  }
  const bool stream = boolean(body, "stream", false);
  const int64_t n_prompt = static_cast<int64_t>(r.prompt.size());
  auto job = submit(std::move(r), res);
  const std::string id = "msg_" + random_id();
  struct State {
    std::string text;
    bool started = false;
  };
  auto st = std::make_shared<State>();
  auto stop_reason = [](const Event& e) {
    return e.stop_type == "word" ? "stop_sequence" : e.stop_type == "limit" ? "max_tokens"
                                                                              : "end_turn";
  };
  auto usage = [](const Event& e) {
    return json{{"input_tokens", e.prompt_tokens},
                {"output_tokens", e.completion_tokens},
                {"cache_read_input_tokens", e.cached_tokens},
                {"cache_creation_input_tokens", 0}};
  };
  auto provider = [=, this](size_t, httplib::DataSink& sink) {
    std::vector<Event> events;
    job->pop(events, 0.1);
    if (!sink.is_writable()) {
      job->cancelled = true;
      return false;
    }
    std::string out;
    auto sse = [&](const char* type, json j) {
      j["type"] = type;
      out += cat("event: ", type, "\ndata: ", dump(j), "\n\n");
    };
    if (stream && !st->started) {
      st->started = true;
      sse("message_start", {{"message",
                             {{"id", id},
                              {"type", "message"},
                              {"role", "assistant"},
                              {"model", model_id},
                              {"content", json::array()},
                              {"stop_reason", nullptr},
                              {"stop_sequence", nullptr},
                              {"usage", {{"input_tokens", n_prompt}, {"output_tokens", 0}}}}}});
      sse("content_block_start", {{"index", 0}, {"content_block", {{"type", "text"}, {"text", ""}}}});
    }
    bool done = false;
    for (Event& e : events) {
      if (!e.error.empty()) {
        const json err = {{"type", "error"}, {"error", {{"type", "api_error"}, {"message", e.error}}}};
        out = stream ? cat("event: error\ndata: ", dump(err), "\n\n") : dump(err);
        done = true;
        break;
      }
      if (stream && !e.text.empty())
        sse("content_block_delta",
            {{"index", 0}, {"delta", {{"type", "text_delta"}, {"text", e.text}}}});
      st->text += e.text;
      if (!e.done) continue;
      count_end(e);
      done = true;
      const json stop_seq = e.stop_type == "word" ? json(e.stopping_word) : json(nullptr);
      if (stream) {
        sse("content_block_stop", {{"index", 0}});
        sse("message_delta", {{"delta", {{"stop_reason", stop_reason(e)}, {"stop_sequence", stop_seq}}},
                              {"usage", {{"output_tokens", e.completion_tokens}}}});
        sse("message_stop", json::object());
      } else {
        out = dump({{"id", id},
                    {"type", "message"},
                    {"role", "assistant"},
                    {"model", model_id},
                    {"content", json::array({{{"type", "text"}, {"text", st->text}}})},
                    {"stop_reason", stop_reason(e)},
                    {"stop_sequence", stop_seq},
                    {"usage", usage(e)}});
      }
      break;
    }
    if (!out.empty() && !sink.write(out.data(), out.size())) {
      job->cancelled = true;
      return false;
    }
    if (done) sink.done();
    return true;
  };
  auto release = [job](bool ok) {
    if (!ok) job->cancelled = true;
  };
  res.set_chunked_content_provider(stream ? "text/event-stream" : "application/json", provider,
                                   release);
}

}  // namespace kvs::cli
